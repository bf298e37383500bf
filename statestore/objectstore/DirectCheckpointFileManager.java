package io.deltawheel.storage;

import java.io.IOException;
import java.util.concurrent.SynchronousQueue;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager;

/**
 * Spark's checkpoint file manager for object stores whose writes become visible whole, at close
 * ({@code s3a://}): {@code createAtomic} writes the file in place instead of writing a temporary
 * file and renaming it. On S3A a rename is a copy and a delete after several existence probes,
 * so the rename-based manager costs 6-8 requests per file; this one costs the PUT (a version's
 * checksum is written once, from that version's state: a second writer of it writes the same
 * content), and Spark's existence check of a log's next file one HEAD instead of a HEAD and a LIST.
 *
 * <p>Every file Spark and Delta write through a checkpoint file manager goes through it: the
 * streaming query's offset and commit logs, the state stores' files, and Delta's checksum file
 * (N.crc) after every commit. The file is atomic as before: S3A uploads it at close, in one PUT
 * (or a multipart upload completed at close), so a reader sees all of it or nothing; {@code
 * cancel()} aborts the upload and nothing appears. "Must not exist" (an offset or commit log's
 * next file) is the upload's {@code If-None-Match: *}: the store refuses it when the file is
 * there, whoever put it, so a zombie query paused between its checks and its upload cannot
 * replace its successor's offsets (Spark takes the FileAlreadyExistsException for a concurrent
 * query and stops). With {@code fs.s3a.create.conditional.enabled=false} (a store that refuses the
 * header) it is S3A's existence probe before the upload, which a racing writer passes.
 *
 * <p>A checksum file's upload runs in the background: Delta writes it after the commit, on the
 * committing thread, and it costs the commit a PUT's round trips (two with S3's
 * {@code Expect: 100-continue}). It is the log store's signed PUT where that signs (S3A's keys and
 * the bucket's host known: {@code ZkS3LogStore.putSigned}), lighter on the JVM's CPU than S3A's.
 * A checksum is optional: Delta reads the newest one there is and replays the log where it is
 * missing, so one lost with its JVM costs nothing. At most 16 go up at once, past that the
 * committing thread uploads its own.
 *
 * <p>A local folder ({@code file:}) is written with the JDK's own file calls: the bytes to a
 * temporary file beside the target, then a hard link onto the target (a file that exists fails
 * the link, atomically, whatever process made it) or, to overwrite, an atomic replacing move.
 * Hadoop's local file system would make each file with {@code chmod} forked from the JVM, twice
 * (the file and its {@code .crc} side file) when its native library is missing, as it is in
 * pyspark's jars: several forks per Delta commit (its checksum) and per streaming batch (the
 * offset and commit logs). Any other file system (HDFS) gets the rename-based manager unchanged.
 */
public class DirectCheckpointFileManager extends FileSystemBasedCheckpointFileManager {

    /** The file systems whose output streams publish the file at close and can abort. */
    private static boolean direct(FileSystem fs) {
        return "s3a".equals(fs.getScheme());
    }

    /** S3A's create option that skips the overwrite and parent-directory probes. */
    static final String PERFORMANCE = "fs.s3a.create.performance";

    /** Hadoop's create option for a put-if-absent upload (S3A: {@code If-None-Match: *}). */
    static final String CONDITIONAL = "fs.option.create.conditional.overwrite";

    /** S3A's switch for conditional writes (on by default; off for a store without them). */
    static final String CONDITIONAL_ENABLED = "fs.s3a.create.conditional.enabled";

    /** A Delta checksum file: {@code _delta_log/<20 digits>.crc}. */
    static boolean checksum(Path path) {
        Path parent = path.getParent();
        return parent != null && "_delta_log".equals(parent.getName()) && path.getName().matches("\\d{20}\\.crc");
    }

    /** A file of a query's offset or commit log: {@code offsets/<digits>}, {@code commits/<digits>}. */
    static boolean batchFile(Path path) {
        Path parent = path.getParent();
        return parent != null && ("offsets".equals(parent.getName()) || "commits".equals(parent.getName()))
                && path.getName().matches("\\d+");
    }

    /** Checksum uploads: a thread each, at most 16, then the caller's own thread. */
    // a thread per upload, up to 16, none waiting in a queue: an upload hung on an unreachable store
    // (S3A's socket timeout is minutes) holds no other checksum behind it; past 16 the caller uploads
    private static final ThreadPoolExecutor CHECKSUMS = new ThreadPoolExecutor(
            0, 16, 30, TimeUnit.SECONDS, new SynchronousQueue<>(), r -> {
                Thread t = new Thread(r, "deltawheel-checksum-upload");
                t.setDaemon(true);
                return t;
            }, new ThreadPoolExecutor.CallerRunsPolicy());

    /** {@code ZkS3LogStore.putSigned} (the log store's jar, found by name), or null without it. */
    private static final java.lang.reflect.Method SIGNED_PUT = signedPut();

    private static java.lang.reflect.Method signedPut() {
        try {
            return Class.forName("io.deltawheel.storage.ZkS3LogStore", false, DirectCheckpointFileManager.class.getClassLoader())
                    .getMethod("putSigned", FileSystem.class, Path.class, byte[].class);
        } catch (ReflectiveOperationException | LinkageError e) {
            return null;
        }
    }

    /** The last checksum upload that failed in this JVM ("path: error"), or null: for a report. */
    private static volatile String lastChecksumFailure;

    public static String lastChecksumFailure() {
        return lastChecksumFailure;
    }

    public DirectCheckpointFileManager(Path path, Configuration hadoopConf) {
        super(path, hadoopConf);
    }

    @Override
    public CheckpointFileManager.CancellableFSDataOutputStream createAtomic(Path path, boolean overwriteIfPossible) {
        FileSystem fs = fs();
        if ("file".equals(fs.getScheme())) {
            try {
                return LocalAtomic.create(fs, path, overwriteIfPossible);
            } catch (IOException e) {
                throw DirectCheckpointFileManager.<RuntimeException>sneaky(e);
            }
        }
        if (!direct(fs)) {
            return super.createAtomic(path, overwriteIfPossible);
        }
        try {
            if (checksum(path)) {
                return new Checksum(fs, path);
            }
            if (overwriteIfPossible || !fs.getConf().getBoolean(CONDITIONAL_ENABLED, true)) {
                // a store without conditional writes: S3A's existence probe before the upload
                return new InPlace(fs.create(path, overwriteIfPossible), path, false);
            }
            // one PUT with If-None-Match, no probe before it: the store refuses the upload if the
            // file is there, whoever put it and when (Spark's logs check exists() first anyway)
            org.apache.hadoop.fs.FSDataOutputStreamBuilder<?, ?> b = fs.createFile(path).overwrite(false);
            b.opt(CONDITIONAL, true);
            return new InPlace(b.build(), path, true);
        } catch (IOException e) {
            // FileAlreadyExistsException must reach Spark as it is (its metadata logs report a
            // concurrent writer by it); the Scala signature declares nothing
            throw DirectCheckpointFileManager.<RuntimeException>sneaky(e);
        }
    }

    /**
     * On S3A a file of a query's offset or commit log ({@code offsets/<batch id>}, checked before
     * each write) is looked for with one HEAD: S3A's exists() also lists the key as a directory when
     * the HEAD finds nothing, a second round trip for the usual answer. Anything else (a folder such
     * as a source log's {@code sources/0}) keeps S3A's probes.
     */
    @Override
    public boolean exists(Path path) {
        FileSystem fs = fs();
        if (direct(fs) && batchFile(path)) {
            try {
                return fs.isFile(path);
            } catch (IOException e) {
                throw DirectCheckpointFileManager.<RuntimeException>sneaky(e);
            }
        }
        return super.exists(path);
    }

    @Override
    public void mkdirs(Path path) {
        FileSystem fs = fs();
        if (!"file".equals(fs.getScheme())) {
            super.mkdirs(path);
            return;
        }
        try {  // Hadoop's local mkdirs forks chmod (as createAtomic's files above)
            java.nio.file.Files.createDirectories(java.nio.file.Paths.get(fs.makeQualified(path).toUri()));
        } catch (IOException e) {
            throw DirectCheckpointFileManager.<RuntimeException>sneaky(e);
        }
    }

    @SuppressWarnings("unchecked")
    private static <E extends Throwable> E sneaky(Throwable e) throws E {
        throw (E) e;
    }

    /** The object store's own output stream: the file appears at close, or never (cancel). */
    static final class InPlace extends CheckpointFileManager.CancellableFSDataOutputStream {
        private final FSDataOutputStream out;
        private final Path path;
        private final boolean ifAbsent;
        private boolean finished;

        InPlace(FSDataOutputStream out, Path path, boolean ifAbsent) {
            super(out);
            this.out = out;
            this.path = path;
            this.ifAbsent = ifAbsent;
        }

        @Override
        public synchronized void close() throws IOException {
            if (finished) {
                return;
            }
            finished = true;
            try {
                out.close();  // the upload: the file is visible once this returns
            } catch (IOException e) {
                // S3A reports a refused If-None-Match (412) as a changed remote file; Spark's logs
                // know a concurrent writer by FileAlreadyExistsException
                if (ifAbsent && "org.apache.hadoop.fs.s3a.RemoteFileChangedException".equals(e.getClass().getName())) {
                    throw (IOException) new org.apache.hadoop.fs.FileAlreadyExistsException(
                            path + " already exists: another writer put it first").initCause(e);
                }
                throw e;
            }
        }

        @Override
        public synchronized void cancel() {
            if (finished) {
                return;
            }
            finished = true;
            try {
                out.abort();  // S3A: the upload is dropped, no object appears
            } catch (UnsupportedOperationException e) {
                throw new IllegalStateException("cannot cancel the write of " + path
                        + ": its output stream cannot abort", e);
            }
        }
    }

    /**
     * Delta's N.crc: written once, after commit N, from that version's state (a second writer of it
     * writes what is there). Kept in memory and uploaded at close in the background, in one PUT
     * without S3A's existence probes: the log store's signed PUT where it signs (as N.json), else
     * S3A's. Visible once its upload ends, or never; cancel() drops it.
     */
    static final class Checksum extends CheckpointFileManager.CancellableFSDataOutputStream {
        private final java.io.ByteArrayOutputStream bytes;
        private final FileSystem fs;
        private final Path path;
        private boolean finished;

        Checksum(FileSystem fs, Path path) {
            this(new java.io.ByteArrayOutputStream(), fs, path);
        }

        private Checksum(java.io.ByteArrayOutputStream bytes, FileSystem fs, Path path) {
            super(bytes);
            this.bytes = bytes;
            this.fs = fs;
            this.path = path;
        }

        @Override
        public synchronized void close() {
            if (finished) {
                return;
            }
            finished = true;
            byte[] data = bytes.toByteArray();
            CHECKSUMS.execute(() -> {
                try {
                    if (SIGNED_PUT == null || !(Boolean) SIGNED_PUT.invoke(null, fs, path, data)) {
                        org.apache.hadoop.fs.FSDataOutputStreamBuilder<?, ?> b = fs.createFile(path).overwrite(true);
                        b.opt(PERFORMANCE, true);
                        try (FSDataOutputStream out = b.build()) {
                            out.write(data);
                        }
                    }
                } catch (Throwable e) {  // logged and kept, not left to the pool's silent handler
                    Throwable cause = e instanceof java.lang.reflect.InvocationTargetException ? e.getCause() : e;
                    lastChecksumFailure = path + ": " + cause;
                    org.slf4j.LoggerFactory.getLogger(DirectCheckpointFileManager.class)
                            .warn("checksum file " + path + " not written (Delta reads an older one): " + cause);
                }
            });
        }

        @Override
        public synchronized void cancel() {
            finished = true;
        }
    }

    /**
     * A local file written to a temporary name beside it and published at close: linked onto the
     * target (Hadoop's FileAlreadyExistsException if it exists, which Spark's metadata logs take
     * for a concurrent writer) or moved over it; cancel() deletes the temporary file.
     */
    static final class LocalAtomic extends CheckpointFileManager.CancellableFSDataOutputStream {
        private final java.nio.file.Path tmp;
        private final java.nio.file.Path target;
        private final Path path;
        private final boolean overwrite;
        private final java.io.OutputStream file;
        private boolean finished;

        private LocalAtomic(java.io.OutputStream file, java.nio.file.Path tmp, java.nio.file.Path target, Path path,
                            boolean overwrite) {
            super(file);
            this.file = file;
            this.tmp = tmp;
            this.target = target;
            this.path = path;
            this.overwrite = overwrite;
        }

        static LocalAtomic create(FileSystem fs, Path path, boolean overwrite) throws IOException {
            java.nio.file.Path target = java.nio.file.Paths.get(fs.makeQualified(path).toUri());
            java.nio.file.Path dir = target.getParent();
            java.nio.file.Files.createDirectories(dir);  // as Hadoop's create makes the parents
            java.nio.file.Path tmp = dir.resolve("." + target.getFileName() + "." + java.util.UUID.randomUUID() + ".tmp");
            java.io.OutputStream out = new java.io.BufferedOutputStream(java.nio.file.Files.newOutputStream(
                    tmp, java.nio.file.StandardOpenOption.CREATE_NEW, java.nio.file.StandardOpenOption.WRITE), 65536);
            return new LocalAtomic(out, tmp, target, path, overwrite);
        }

        @Override
        public synchronized void close() throws IOException {
            if (finished) {
                return;
            }
            finished = true;
            try {
                super.close();  // flushes and closes the temporary file
                if (overwrite) {
                    java.nio.file.Files.move(tmp, target, java.nio.file.StandardCopyOption.REPLACE_EXISTING,
                            java.nio.file.StandardCopyOption.ATOMIC_MOVE);
                    return;
                }
                try {
                    java.nio.file.Files.createLink(target, tmp);
                } catch (java.nio.file.FileAlreadyExistsException e) {
                    throw new org.apache.hadoop.fs.FileAlreadyExistsException(path + " already exists");
                } catch (UnsupportedOperationException e) {  // no hard links here: the JVM-locked check
                    moveIfAbsent(tmp, target, path);
                }
            } finally {
                java.nio.file.Files.deleteIfExists(tmp);
            }
        }

        private static synchronized void moveIfAbsent(java.nio.file.Path tmp, java.nio.file.Path target, Path path)
                throws IOException {
            if (java.nio.file.Files.exists(target)) {
                throw new org.apache.hadoop.fs.FileAlreadyExistsException(path + " already exists");
            }
            java.nio.file.Files.move(tmp, target, java.nio.file.StandardCopyOption.ATOMIC_MOVE);
        }

        @Override
        public synchronized void cancel() {
            if (finished) {
                return;
            }
            finished = true;
            try {
                file.close();
            } catch (IOException e) {
                // the temporary file goes below either way
            }
            try {
                java.nio.file.Files.deleteIfExists(tmp);
            } catch (IOException e) {
                org.slf4j.LoggerFactory.getLogger(DirectCheckpointFileManager.class)
                        .warn("could not delete " + tmp + ": " + e);
            }
        }
    }
}
