package io.deltawheel.storage;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InputStream;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.retry.ExponentialBackoffRetry;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.curator.framework.api.ACLProvider;
import org.apache.zookeeper.KeeperException;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.data.ACL;
import org.apache.zookeeper.data.Id;
import org.apache.zookeeper.server.auth.DigestAuthenticationProvider;

import io.delta.storage.HadoopFileSystemLogStore;

/**
 * Delta log store for object stores ({@code s3a://}) whose commit of version N is exclusive
 * across processes: ZooKeeper arbitrates it.
 *
 * <p>S3 has no atomic put-if-absent that Hadoop's S3A uses for a plain {@code create}: Delta's
 * {@code S3SingleDriverLogStore} checks and writes under a lock of one JVM, so two Spark
 * applications can both write {@code _delta_log/N.json}, the later replacing the earlier. This
 * store follows the protocol of Delta's {@code BaseExternalLogStore} (reference implementation:
 * the DynamoDB log store), with a ZooKeeper znode as the external entry:
 * <ol>
 *   <li>Fail if N.json exists. Make sure N-1.json exists (completing an unfinished commit of
 *       N-1 from its entry if needed; a complete entry of N-1 says it exists).</li>
 *   <li>PREPARE: create the entry znode {@code <ns>/<table>/N.json} = (the commit's bytes,
 *       complete=false). A commit above the inline limit ({@code deltawheel.logstore.inlineMaxBytes},
 *       256 KiB) writes its bytes to a temporary file {@code _delta_log/.tmp/N.json.<uuid>} first
 *       and the entry names that file. The create fails with NodeExists if another writer holds
 *       version N: that is the mutual exclusion, decided by ZooKeeper, whatever the process.</li>
 *   <li>COMMIT: write N.json (the bytes, kept in memory: no read back).</li>
 *   <li>ACKNOWLEDGE: mark the entry complete, with an expiry time (the bytes leave the entry).
 *       In the background, after the commit returns (N.json is in the log by then); this JVM's
 *       next commit or listing of the table waits for it first, and another process that reads
 *       the log meanwhile completes the entry itself ({@code deltawheel.logstore.ackInBackground=false}:
 *       before returning).</li>
 * </ol>
 * A commit of N by a JVM whose last commit to the table was N-1, less than half the entries'
 * expiry ago (at most {@link #FOLLOW_MAX_MS}) and acknowledged, skips step 1 and the probe of
 * step 0 (an entry whose acknowledgement failed is left to step 1, which completes it): N-1.json
 * is in the log (this JVM wrote it), and another writer's entry of N was created after this
 * JVM's entry of N-1, so it has not expired and the create of step 2 decides alone.
 * A writer that dies after step 2 leaves an incomplete entry; the next writer (step 1 of N+1) or
 * reader ({@link #listFrom}) writes N.json from the entry's bytes (or copies its temporary file)
 * and completes the entry, so a commit whose entry exists is never lost. Complete entries older
 * than their expiry are removed by later commits (an expired entry only guards against a writer
 * that stalled for longer than the expiry between its step 1 and step 2; S3 listings are strongly
 * consistent).
 *
 * <p>Checksum files (N.crc) handed to this store are PUT in the background: the commit does not
 * wait for them, and a reader that finds none rebuilds the version's state from the log
 * ({@code deltawheel.logstore.syncChecksums=true} writes them before returning). Delta 4.4's
 * post-commit checksum hook does not write through the log store but through Spark's checkpoint
 * file manager, synchronously; on {@code s3a://} that is {@code DirectCheckpointFileManager} (one
 * PUT, no rename).
 *
 * <p>Configuration (Hadoop keys; Spark: {@code spark.hadoop.<key>}):
 * {@code deltawheel.logstore.zk.connect} (ZooKeeper connect string),
 * {@code deltawheel.logstore.zk.namespace} (znode prefix, default {@code deltawheel/delta-log}),
 * {@code deltawheel.logstore.zk.sessionTimeoutMs} (default 20000),
 * {@code deltawheel.logstore.expirationDelaySeconds} (default 86400, Delta's own),
 * {@code deltawheel.logstore.zk.digestSecret} ({@code user:password}: entries carry a digest ACL).
 * Reads without a configured ZooKeeper list the log as it is; commits refuse.
 *
 * <p>Requests per commit: existence is probed with {@link FileSystem#isFile} (on S3A one HEAD;
 * {@code exists} adds a LIST for a directory of that name, which a log entry never is), and
 * N.json (and a temporary file) are created without S3A's overwrite probes
 * ({@code fs.s3a.create.performance}): a temporary name is new (a UUID) and N.json is written
 * only by the holder of entry N or by a process completing that entry, both with the same bytes.
 * ZooKeeper, not a probe, decides who commits N; S3A's probe-then-PUT was never atomic anyway.
 * A commit under the inline limit makes one HEAD and one PUT on the store, besides Delta's own
 * listing of the log; one that follows this JVM's previous commit, one PUT. The PUTs of this store
 * are {@link SignedPut}'s where S3A's keys and the bucket's host are known (S3A's otherwise): at
 * 50 ms per response, 16 writers landed 1.2 times the commits with S3A's (docs/scale.md). Delta's status
 * request for the new N.json right after is answered from {@link #takeWritten} when the session's
 * S3A is {@code CommitStatusS3AFileSystem}.
 *
 * <p>One file of over 500 lines: {@code compile_jar} builds one jar per source, and the commit
 * protocol, its recovery ({@code fix}), the entries' encoding and the PUT they share read best
 * side by side.
 */
public class ZkS3LogStore extends HadoopFileSystemLogStore {

    public static final String CONNECT = "deltawheel.logstore.zk.connect";
    public static final String NAMESPACE = "deltawheel.logstore.zk.namespace";
    public static final String SESSION_TIMEOUT = "deltawheel.logstore.zk.sessionTimeoutMs";
    public static final String EXPIRATION = "deltawheel.logstore.expirationDelaySeconds";
    /**
     * {@code user:password}: the entries carry a digest ACL (all rights to that user, read to
     * everyone), as the pipelines' lease znodes do. The key says "secret" so that Spark's UI and
     * logs redact it ({@code spark.redaction.regex}).
     */
    public static final String DIGEST = "deltawheel.logstore.zk.digestSecret";
    /** S3A's create option that skips the overwrite and parent-directory probes (ignored elsewhere). */
    static final String CREATE_PERFORMANCE = "fs.s3a.create.performance";
    /** Test hook: exit the JVM right after the entry is created (a writer dying mid-commit). */
    public static final String CRASH_AFTER_PREPARE = "deltawheel.logstore.test.crashAfterPrepare";
    /** Test hook: sleep this long after the Step 0 probe (a writer slowed down between steps). */
    public static final String PAUSE_AFTER_PROBE_MS = "deltawheel.logstore.test.pauseAfterProbeMs";
    /** Test hook: the pause after the probe ends early once a file exists at this path. */
    public static final String PAUSE_RELEASE_PATH = "deltawheel.logstore.test.pauseReleasePath";

    private static final Pattern DELTA_FILE = Pattern.compile("^(\\d{20})\\.json$");
    /** Commits up to this many bytes travel inside their ZooKeeper entry (no temporary file). */
    public static final String INLINE_MAX = "deltawheel.logstore.inlineMaxBytes";
    /** Complete each entry after its commit returns (default true), instead of before. */
    public static final String ACK_IN_BACKGROUND = "deltawheel.logstore.ackInBackground";
    /** Write checksum files (N.crc) before the commit call returns instead of in the background. */
    public static final String SYNC_CHECKSUMS = "deltawheel.logstore.syncChecksums";
    /** Below ZooKeeper's default 1 MiB znode limit (jute.maxbuffer), with room for the header. */
    static final int DEFAULT_INLINE_MAX = 256 * 1024;
    private static final java.util.concurrent.ExecutorService CHECKSUM_WRITER = daemon("deltawheel-checksum-writer");
    private static final Map<String, CuratorFramework> CLIENTS = new ConcurrentHashMap<>();
    /** Acknowledges (completes) this JVM's entries after their commit returned, in order. */
    private static final java.util.concurrent.ExecutorService ACKNOWLEDGER = daemon("deltawheel-log-acknowledger");
    /** One background thread, named {@code name}, that does not keep the JVM alive. */
    private static java.util.concurrent.ExecutorService daemon(String name) {
        return java.util.concurrent.Executors.newSingleThreadExecutor(r -> {
            Thread t = new Thread(r, name);
            t.setDaemon(true);
            return t;
        });
    }

    /** Per table: the last version this JVM committed (its N.json written) and its acknowledgement. */
    private static final Map<String, Written> WRITTEN = new ConcurrentHashMap<>();
    /** Per table: the status of the N.json this JVM wrote last, until {@link #takeWritten} hands it over. */
    private static final Map<String, FileStatus> LAST_WRITTEN = new ConcurrentHashMap<>();

    /**
     * The status of {@code qualified} if it is the N.json this JVM wrote last for its table (its
     * length, the time its PUT returned), once: Delta asks for it right after the commit, and
     * {@link CommitStatusS3AFileSystem} answers from here instead of a HEAD. Else null.
     */
    public static FileStatus takeWritten(Path qualified) {
        Path parent = qualified.getParent();
        if (parent == null || parent.getParent() == null) {
            return null;
        }
        String table = tablePathOf(qualified).toString();
        FileStatus status = LAST_WRITTEN.get(table);
        return status != null && status.getPath().equals(qualified) && LAST_WRITTEN.remove(table, status)
            ? status : null;
    }

    /** The longest time after this JVM committed N-1 in which its commit of N skips the probes. */
    static final long FOLLOW_MAX_MS = 3_600_000L;

    /** This JVM's last commit of a table: its version, when its entry was created, its acknowledgement. */
    static final class Written {
        final long version;
        final long createdMs;
        final java.util.concurrent.Future<Boolean> ack;

        Written(long version, long createdMs, java.util.concurrent.Future<Boolean> ack) {
            this.version = version;
            this.createdMs = createdMs;
            this.ack = ack;
        }

        /** Wait for the acknowledgement; whether the entry was completed. Its failure is
         * recoverable: the next reader or writer that looks at the entry completes it (fix). */
        boolean awaitAck() {
            try {
                return Boolean.TRUE.equals(ack.get(30, TimeUnit.SECONDS));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return false;
            } catch (java.util.concurrent.ExecutionException | java.util.concurrent.TimeoutException e) {
                return false;
            }
        }
    }

    private final Configuration initConf;

    public ZkS3LogStore(Configuration initHadoopConf) {
        super(initHadoopConf);
        this.initConf = initHadoopConf;
    }

    /**
     * An entry of the external store: where version N's bytes wait until N.json holds them (inline
     * in the entry, or a temporary file for a commit larger than the inline limit), and whether
     * N.json was written. A completed entry keeps no bytes.
     */
    static final class Entry {
        final String tempPath;  // relative to the _delta_log folder; empty when the bytes are inline
        final boolean complete;
        final long expireEpochS;
        final byte[] inline;    // the commit's bytes (null: in the temporary file, or complete)

        Entry(String tempPath, boolean complete, long expireEpochS, byte[] inline) {
            this.tempPath = tempPath;
            this.complete = complete;
            this.expireEpochS = expireEpochS;
            this.inline = inline;
        }

        byte[] encode() {
            byte[] head = ("v2\n" + tempPath + "\n" + complete + "\n" + expireEpochS + "\n"
                + (inline == null ? -1 : inline.length) + "\n").getBytes(StandardCharsets.UTF_8);
            if (inline == null) {
                return head;
            }
            byte[] all = new byte[head.length + inline.length];
            System.arraycopy(head, 0, all, 0, head.length);
            System.arraycopy(inline, 0, all, head.length, inline.length);
            return all;
        }

        static Entry decode(byte[] data) throws IOException {
            // v1 (temporary file only): "v1\n<temp>\n<complete>\n<expiry>"; v2 adds the inline
            // length and the bytes after the fifth newline
            List<String> f = new ArrayList<>();
            int start = 0;
            for (int i = 0; i < data.length && f.size() < 5; i++) {
                if (data[i] == '\n') {
                    f.add(new String(data, start, i - start, StandardCharsets.UTF_8));
                    start = i + 1;
                }
            }
            if (f.size() == 3 && "v1".equals(f.get(0))) {
                f.add(new String(data, start, data.length - start, StandardCharsets.UTF_8));
                return new Entry(f.get(1), Boolean.parseBoolean(f.get(2)), Long.parseLong(f.get(3)), null);
            }
            if (f.size() == 5 && "v2".equals(f.get(0))) {
                int n = Integer.parseInt(f.get(4));
                if (n >= 0 && data.length - start != n || n < 0 && data.length != start) {
                    throw new IOException("log store entry of " + (data.length - start) + " bytes after its header "
                        + "says " + n + ": truncated or damaged");
                }
                byte[] inline = n < 0 ? null : java.util.Arrays.copyOfRange(data, start, data.length);
                return new Entry(f.get(1), Boolean.parseBoolean(f.get(2)), Long.parseLong(f.get(3)), inline);
            }
            throw new IOException("unknown log store entry format: "
                + new String(data, 0, Math.min(data.length, 200), StandardCharsets.UTF_8));
        }
    }

    // --- configuration and ZooKeeper ------------------------------------------------------

    private String setting(Configuration conf, String key, String dflt) {
        String v = conf != null ? conf.get(key) : null;
        if (v == null || v.isEmpty()) {
            v = initConf.get(key);
        }
        return v == null || v.isEmpty() ? dflt : v;
    }

    private CuratorFramework zk(Configuration conf, boolean required) throws IOException {
        String connect = setting(conf, CONNECT, null);
        if (connect == null) {
            if (required) {
                throw new IOException("no ZooKeeper configured for commits to object-store Delta tables: set "
                    + CONNECT + " (Spark: spark.hadoop." + CONNECT + "), or DELTAWHEEL_ZK for deltawheel's "
                    + "command line; the pipeline runner sets it from its ZooKeeper (docs/objectstore.md)");
            }
            return null;
        }
        String ns = setting(conf, NAMESPACE, "deltawheel/delta-log");
        int sessionMs = Integer.parseInt(setting(conf, SESSION_TIMEOUT, "20000"));
        String digest = setting(conf, DIGEST, null);
        if (digest != null && digest.indexOf(':') <= 0) {
            throw new IOException(DIGEST + " must be user:password");
        }
        String key = connect + "|" + ns + "|" + sessionMs + "|" + (digest == null ? "" : digest);
        CuratorFramework client = CLIENTS.computeIfAbsent(key, k -> {
            CuratorFrameworkFactory.Builder b = CuratorFrameworkFactory.builder().connectString(connect).namespace(ns)
                .sessionTimeoutMs(sessionMs).connectionTimeoutMs(15000)
                .retryPolicy(new ExponentialBackoffRetry(200, 5));
            if (digest != null) {
                List<ACL> acls = digestAcls(digest);
                b = b.authorization("digest", digest.getBytes(StandardCharsets.UTF_8)).aclProvider(new ACLProvider() {
                    @Override
                    public List<ACL> getDefaultAcl() {
                        return acls;
                    }

                    @Override
                    public List<ACL> getAclForPath(String path) {
                        return acls;
                    }
                });
            }
            CuratorFramework c = b.build();
            c.start();
            return c;
        });
        try {
            if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) {
                throw new IOException("ZooKeeper at " + connect + " did not answer within 30 s; Delta commits to "
                    + "object-store tables wait for it: start it or fix " + CONNECT);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IOException("interrupted while connecting to ZooKeeper at " + connect, e);
        }
        return client;
    }

    private int inlineMaxBytes(Configuration conf) {
        return Math.min(Integer.parseInt(setting(conf, INLINE_MAX, String.valueOf(DEFAULT_INLINE_MAX))),
                        DEFAULT_INLINE_MAX * 3);
    }

    /** All rights to the digest user, read to everyone (deltawheel's ``digest_acls``). */
    static List<ACL> digestAcls(String digest) {
        try {
            // a mutable list: ZooKeeper's ACL check asks contains(null), which List.of refuses
            List<ACL> acls = new ArrayList<>();
            acls.add(new ACL(ZooDefs.Perms.ALL, new Id("digest", DigestAuthenticationProvider.generateDigest(digest))));
            acls.add(new ACL(ZooDefs.Perms.READ, ZooDefs.Ids.ANYONE_ID_UNSAFE));
            return Collections.unmodifiableList(acls);
        } catch (java.security.NoSuchAlgorithmException e) {
            throw new IllegalStateException("no SHA1 for ZooKeeper's digest ACL", e);
        }
    }

    private static String tableNode(Path tablePath) {
        return "/" + URLEncoder.encode(tablePath.toString(), StandardCharsets.UTF_8);
    }

    private static Optional<Entry> getEntry(CuratorFramework zk, Path tablePath, String fileName) throws IOException {
        try {
            return Optional.of(Entry.decode(zk.getData().forPath(tableNode(tablePath) + "/" + fileName)));
        } catch (KeeperException.NoNodeException e) {
            return Optional.empty();
        } catch (IOException e) {
            throw e;
        } catch (Exception e) {
            throw new IOException("ZooKeeper read of the log entry " + fileName + " of " + tablePath + " failed", e);
        }
    }

    /** Create the entry of version N; FileAlreadyExistsException if another writer holds it. */
    private static void createEntry(CuratorFramework zk, Path tablePath, String fileName, Entry entry, Path path)
            throws IOException {
        try {
            zk.create().creatingParentsIfNeeded().forPath(tableNode(tablePath) + "/" + fileName, entry.encode());
        } catch (KeeperException.NodeExistsException e) {
            throw new FileAlreadyExistsException(path.toString());
        } catch (KeeperException.NoAuthException e) {
            throw new IOException("ZooKeeper refused the log entry " + fileName + " of " + tablePath + ": the "
                + "table's entries carry a digest ACL and this process has not the digest (set " + DIGEST
                + ", or DELTAWHEEL_ZK_DIGEST / --zk-digest as the pipelines that write it); nothing was committed", e);
        } catch (Exception e) {
            throw new IOException("ZooKeeper create of the log entry " + fileName + " of " + tablePath
                + " failed; nothing was committed", e);
        }
    }

    private void completeEntry(CuratorFramework zk, Path tablePath, String fileName, Entry entry, Configuration conf)
            throws IOException {
        long expiry = Long.parseLong(setting(conf, EXPIRATION, "86400"));
        Entry done = new Entry(entry.tempPath, true, System.currentTimeMillis() / 1000 + expiry, null);
        try {
            zk.setData().forPath(tableNode(tablePath) + "/" + fileName, done.encode());
        } catch (Exception e) {
            throw new IOException("ZooKeeper update of the log entry " + fileName + " of " + tablePath + " failed", e);
        }
    }

    private static List<String> entryNames(CuratorFramework zk, Path tablePath) throws IOException {
        try {
            List<String> names = new ArrayList<>(zk.getChildren().forPath(tableNode(tablePath)));
            names.removeIf(n -> !DELTA_FILE.matcher(n).matches());
            Collections.sort(names);  // 20-digit zero-padded versions: text order is version order
            return names;
        } catch (KeeperException.NoNodeException e) {
            return Collections.emptyList();
        } catch (Exception e) {
            throw new IOException("ZooKeeper listing of the log entries of " + tablePath + " failed", e);
        }
    }

    /** Remove complete entries past their expiry (never the newest: it guards the next version). */
    private static void removeExpired(CuratorFramework zk, Path tablePath, List<String> names) {
        long now = System.currentTimeMillis() / 1000;
        for (String name : names.subList(0, Math.max(0, names.size() - 1))) {
            try {
                Optional<Entry> e = getEntry(zk, tablePath, name);
                if (e.isPresent() && e.get().complete && e.get().expireEpochS < now) {
                    zk.delete().forPath(tableNode(tablePath) + "/" + name);
                }
            } catch (Exception ignored) {
                // another writer removed it, or ZooKeeper is busy: the next commit tries again
            }
        }
    }

    // --- the protocol ---------------------------------------------------------------------

    private static Path logDir(Path resolved) {
        return resolved.getParent();
    }

    private static Path tablePathOf(Path resolved) {
        return resolved.getParent().getParent();
    }

    /** Copy an unfinished commit's temporary file to its N.json and mark the entry complete. */
    private void fix(FileSystem fs, CuratorFramework zk, Path tablePath, String fileName, Entry entry,
                     Configuration conf) throws IOException {
        if (entry.complete) {
            return;
        }
        Path dir = new Path(tablePath, "_delta_log");
        Path target = new Path(dir, fileName);
        IOException last = null;
        for (int attempt = 0; attempt < 4; attempt++) {
            try {
                if (!fs.isFile(target)) {
                    if (entry.inline != null) {
                        put(fs, target, entry.inline);  // the same bytes its writer would have written
                    } else {
                        copy(fs, new Path(dir, entry.tempPath), target);
                    }
                }
                completeEntry(zk, tablePath, fileName, entry, conf);
                return;
            } catch (FileAlreadyExistsException e) {
                // another process completed it first: only the entry's flag is left to set
                last = e;
            } catch (IOException e) {
                last = e;
            }
        }
        throw last;
    }

    private static void copy(FileSystem fs, Path src, Path dst) throws IOException {
        try (InputStream in = fs.open(src)) {
            FSDataOutputStream out = fs.create(dst, false);
            in.transferTo(out);
            out.close();  // not closed on error: S3A would upload a partial file
        } catch (org.apache.hadoop.fs.FileAlreadyExistsException e) {
            throw new FileAlreadyExistsException(dst.toString());
        }
    }

    private static byte[] bytesOf(Iterator<String> actions) {
        java.io.ByteArrayOutputStream buf = new java.io.ByteArrayOutputStream();
        while (actions.hasNext()) {
            buf.writeBytes((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
        }
        return buf.toByteArray();
    }

    /** Write {@code data} to {@code path} in one PUT, without S3A's existence and directory probes ({@link SignedPut} where it can). */
    @SuppressWarnings({"rawtypes", "unchecked"})
    private static void put(FileSystem fs, Path path, byte[] data) throws IOException {
        if (putSigned(fs, path, data)) {
            return;
        }
        org.apache.hadoop.fs.FSDataOutputStreamBuilder builder = fs.createFile(path).overwrite(true);
        builder.opt(CREATE_PERFORMANCE, true);
        FSDataOutputStream out = (FSDataOutputStream) builder.build();
        out.write(data);
        out.close();  // not closed on error: S3A would upload a partial file
    }

    private static byte[] actionBytes(Iterator<String> actions) {
        java.io.ByteArrayOutputStream buf = new java.io.ByteArrayOutputStream();
        while (actions.hasNext()) {
            byte[] line = (actions.next() + "\n").getBytes(StandardCharsets.UTF_8);
            buf.write(line, 0, line.length);
        }
        return buf.toByteArray();
    }

    @Override
    public Iterator<FileStatus> listFrom(Path path, Configuration hadoopConf) throws IOException {
        FileSystem fs = path.getFileSystem(hadoopConf);
        Path resolved = fs.makeQualified(path);
        CuratorFramework zk = zk(hadoopConf, false);
        if (zk != null) {
            Path tablePath = tablePathOf(resolved);
            Written last = WRITTEN.get(tablePath.toString());
            if (last != null) {
                last.awaitAck();  // else this JVM would find its own last entry open and complete it again
            }
            List<String> names = entryNames(zk, tablePath);
            if (!names.isEmpty()) {
                String latest = names.get(names.size() - 1);
                Optional<Entry> e = getEntry(zk, tablePath, latest);
                if (e.isPresent() && !e.get().complete) {
                    fix(fs, zk, tablePath, latest, e.get(), hadoopConf);
                }
            }
        }
        return super.listFrom(path, hadoopConf);
    }

    @Override
    public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
            throws IOException {
        FileSystem fs = path.getFileSystem(hadoopConf);
        Path resolved = fs.makeQualified(path);
        Matcher m = DELTA_FILE.matcher(resolved.getName());
        if (overwrite || !m.matches()) {
            // _last_checkpoint, checksums: not arbitrated (as Delta's external stores). A checksum
            // (N.crc) is written once, after commit N, from that version's state, so a second
            // writer of it writes what is there: one PUT without probes, like N.json. Other names
            // keep the no-overwrite check.
            boolean checksum = resolved.getName().endsWith(".crc");
            if (!overwrite && !checksum && fs.isFile(resolved)) {
                throw new FileAlreadyExistsException(path.toString());
            }
            byte[] bytes = actionBytes(actions);
            if (checksum && !hadoopConf.getBoolean(SYNC_CHECKSUMS, false)) {
                // in the background: the commit is done, and a reader without N.crc (not yet
                // written, or lost with the JVM) rebuilds the state from the log. One PUT is atomic:
                // a reader never sees half a checksum.
                CHECKSUM_WRITER.execute(() -> {
                    try {
                        put(fs, resolved, bytes);
                    } catch (IOException | RuntimeException e) {
                        System.err.println("deltawheel: checksum " + resolved + " not written (" + e + "); "
                            + "readers of that version rebuild its state from the log");
                    }
                });
                return;
            }
            put(fs, resolved, bytes);
            return;
        }
        CuratorFramework zk = zk(hadoopConf, true);
        Path tablePath = tablePathOf(resolved);
        Path dir = logDir(resolved);
        long version = Long.parseLong(m.group(1));
        Written last = WRITTEN.get(tablePath.toString());
        // this JVM's entries are completed in version order; one whose completion failed is left
        // to Step 1, which completes it
        boolean acked = last != null && last.awaitAck();
        // This JVM committed N-1 (its N.json written, its entry complete) lately: N-1 is in the
        // log, and any other writer's entry of N was created after ours of N-1, so it has not
        // expired (its expiry is counted from its completion) and ZooKeeper alone decides N: no
        // probe is needed
        long expiryMs = 1000L * Long.parseLong(setting(hadoopConf, EXPIRATION, "86400"));
        boolean follows = acked && last.version == version - 1
            && System.currentTimeMillis() - last.createdMs < Math.min(expiryMs / 2, FOLLOW_MAX_MS);
        if (!follows && fs.isFile(resolved)) {  // Step 0
            throw new FileAlreadyExistsException(path.toString());
        }
        long pause = hadoopConf.getLong(PAUSE_AFTER_PROBE_MS, 0L);
        if (pause > 0) {
            // with a release path the pause ends as soon as that file exists (a test says when)
            String release = hadoopConf.get(PAUSE_RELEASE_PATH);
            long until = System.currentTimeMillis() + pause;
            try {
                while (System.currentTimeMillis() < until) {
                    if (release != null && fs.exists(new Path(release))) {
                        break;
                    }
                    Thread.sleep(release == null ? Math.max(1L, until - System.currentTimeMillis()) : 20L);
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        // Step 1: N-1 must be in the log; finish it from its entry if its writer died (nothing to
        // do when this JVM wrote it and completed its entry: follows)
        if (version > 0) {
            String prev = String.format("%020d.json", version - 1);
            Optional<Entry> prevEntry = follows ? Optional.empty() : getEntry(zk, tablePath, prev);
            if (prevEntry.isPresent() && !prevEntry.get().complete) {
                fix(fs, zk, tablePath, prev, prevEntry.get(), hadoopConf);
            } else if (!follows && !prevEntry.isPresent() && !fs.isFile(new Path(dir, prev))) {
                // (a complete entry is set only after N-1.json was written: no probe needed)
                throw new FileNotFoundException("previous commit " + new Path(dir, prev) + " doesn't exist");
            }
        } else {
            Optional<Entry> e = getEntry(zk, tablePath, resolved.getName());
            if (e.isPresent() && e.get().complete) {
                if (fs.isFile(resolved)) {
                    // another writer committed version 0 after our Step 0 probe: it won the race
                    throw new FileAlreadyExistsException(path.toString());
                }
                throw new IOException("ZooKeeper holds a completed entry for version 0 of " + tablePath
                    + " but the table has no 00000000000000000000.json: the table was deleted by hand; "
                    + "remove the znode " + tableNode(tablePath) + " below the namespace, or use a new path");
            }
        }
        // Step 2: PREPARE - the bytes in the entry itself (or, above the inline limit, in a
        // temporary file written first), then the entry (exclusive: ZooKeeper decides)
        byte[] data = bytesOf(actions);
        Entry entry;
        if (data.length <= inlineMaxBytes(hadoopConf)) {
            entry = new Entry("", false, 0, data);
        } else {
            String tempName = ".tmp/" + resolved.getName() + "." + UUID.randomUUID();
            put(fs, new Path(dir, tempName), data);
            entry = new Entry(tempName, false, 0, null);
        }
        long created = System.currentTimeMillis();
        createEntry(zk, tablePath, resolved.getName(), entry, path);
        if (hadoopConf.getBoolean(CRASH_AFTER_PREPARE, false)) {
            Runtime.getRuntime().halt(137);
        }
        // Steps 3-4: COMMIT (N.json = the temporary file's bytes) and ACKNOWLEDGE (entry complete).
        // Version N is ours from here: a failure leaves an incomplete entry that the next writer or
        // reader completes from the temporary file (the same bytes; a completer racing this PUT
        // writes them too). The acknowledgement runs after the commit returns (N.json is in the
        // log by then; until it lands, another process's reader completes the entry itself, with
        // the same bytes); this JVM's next commit or listing of the table waits for it first.
        try {
            put(fs, resolved, data);
        } catch (IOException e) {
            // recoverable: listFrom / the next commit finishes it from the entry; said, as a refusal
            // that lasts (wrong keys, a full bucket) fails that writer too
            System.err.println("deltawheel: " + resolved + " not written after its log entry was made (" + e
                + "); the next commit or listing of " + tablePath + " writes it from the entry");
            return;
        }
        LAST_WRITTEN.put(tablePath.toString(), new FileStatus(data.length, false, 1, fs.getDefaultBlockSize(resolved),
            System.currentTimeMillis(), resolved));
        String name = resolved.getName();
        java.util.concurrent.Callable<Boolean> complete = () -> {
            try {
                completeEntry(zk, tablePath, name, entry, hadoopConf);
                return true;
            } catch (IOException e) {
                return false;  // recoverable, as above
            }
        };
        java.util.concurrent.Future<Boolean> ack;
        if (hadoopConf.getBoolean(ACK_IN_BACKGROUND, true)) {
            ack = ACKNOWLEDGER.submit(complete);
        } else {
            java.util.concurrent.FutureTask<Boolean> now = new java.util.concurrent.FutureTask<>(complete);
            now.run();
            ack = now;
        }
        WRITTEN.put(tablePath.toString(), new Written(version, created, ack));
        if (version % 50 == 0) {
            removeExpired(zk, tablePath, entryNames(zk, tablePath));
        }
    }

    @Override
    public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
        return false;
    }

    /**
     * Write {@code data} to {@code path} in one {@link SignedPut} when S3A's keys and the bucket's host
     * are known; false (nothing written) otherwise. Also deltawheel's checkpoint file manager's way to
     * upload a checksum (another jar: it finds this method by name).
     */
    public static boolean putSigned(FileSystem fs, Path path, byte[] data) throws IOException {
        SignedPut signed = data.length <= SignedPut.MAX ? SignedPut.of(fs, path) : null;
        if (signed == null) {
            return false;
        }
        signed.put(path, data);
        return true;
    }

    /**
     * One PUT signed with AWS signature version 4 on a kept-alive connection of the JDK's own HTTP
     * client, without {@code Expect}: N.json and temporary files, when S3A's keys for the bucket are in
     * its configuration and the bucket's host is known (an endpoint, or AWS in a set region and a
     * bucket name without dots), the rule of the Python side's signed PUT ({@code storefs._signs}),
     * and no proxy is set ({@code fs.s3a.proxy.host}: S3A's way there, which this client does not take).
     * S3A's AWS SDK spends about a millisecond of CPU per request on its pipeline (docs/scale.md);
     * anything else (the default credential chain, no endpoint or region) keeps S3A.
     */
    static final class SignedPut {
        static final int MAX = 16 << 20;
        private static final java.net.http.HttpClient HTTP = java.net.http.HttpClient.newBuilder()
            .version(java.net.http.HttpClient.Version.HTTP_1_1)
            .connectTimeout(java.time.Duration.ofSeconds(60)).build();
        private static final java.time.format.DateTimeFormatter STAMP = java.time.format.DateTimeFormatter
            .ofPattern("yyyyMMdd'T'HHmmss'Z'").withZone(java.time.ZoneOffset.UTC);
        private final String scheme, host, prefix, region, accessKey, secretKey, token;

        private SignedPut(String scheme, String host, String prefix, String region, String accessKey,
                          String secretKey, String token) {
            this.scheme = scheme;
            this.host = host;
            this.prefix = prefix;
            this.region = region;
            this.accessKey = accessKey;
            this.secretKey = secretKey;
            this.token = token;
        }

        /** The signer of {@code path}'s bucket on {@code fs}, or null when S3A must write it. */
        static SignedPut of(FileSystem fs, Path path) throws IOException {
            String bucket = path.toUri().getHost();
            if (!"s3a".equals(fs.getScheme()) || bucket == null) {
                return null;
            }
            Configuration conf = fs.getConf();
            String access = setting(conf, bucket, "access.key", true), secret = setting(conf, bucket, "secret.key", true);
            String endpoint = setting(conf, bucket, "endpoint", false);
            String region = setting(conf, bucket, "endpoint.region", false);
            region = region != null ? region : setting(conf, bucket, "region", false);
            String scheme = "false".equalsIgnoreCase(setting(conf, bucket, "connection.ssl.enabled", false)) ? "http" : "https";
            if (endpoint != null && endpoint.contains("://")) {
                java.net.URI u = java.net.URI.create(endpoint);
                scheme = u.getScheme();
                endpoint = u.getRawAuthority();
            }
            if (access == null || secret == null || (endpoint == null && (region == null || bucket.contains(".")))
                    || setting(conf, bucket, "proxy.host", false) != null) {  // S3A reaches it through a proxy
                return null;
            }
            String r = region == null ? "us-east-1" : region;
            boolean pathStyle = "true".equalsIgnoreCase(setting(conf, bucket, "path.style.access", false));
            String host = endpoint == null ? bucket + ".s3." + r + ".amazonaws.com" : pathStyle ? endpoint : bucket + "." + endpoint;
            return new SignedPut(scheme, host, endpoint != null && pathStyle ? "/" + bucket : "", r, access, secret,
                setting(conf, bucket, "session.token", true));
        }

        /** S3A's setting for {@code bucket} (its per-bucket key first); secrets through Hadoop's credential providers. */
        private static String setting(Configuration conf, String bucket, String key, boolean secret) throws IOException {
            for (String name : new String[] {"fs.s3a.bucket." + bucket + "." + key, "fs.s3a." + key}) {
                String value;
                if (secret) {
                    char[] chars = conf.getPassword(name);
                    value = chars == null ? null : new String(chars);
                } else {
                    value = conf.get(name);
                }
                if (value != null && !value.trim().isEmpty()) {
                    return value.trim();
                }
            }
            return null;
        }

        /**
         * PUT {@code data} as {@code path}'s key; a dropped connection or a passing server trouble (429,
         * 500, 502-504) is tried again, 4 attempts in all; any other answer raises.
         */
        void put(Path path, byte[] data) throws IOException {
            String uriPath = prefix + encode(path.toUri().getPath());
            java.net.URI uri = java.net.URI.create(scheme + "://" + host + uriPath);
            int port = uri.getPort();  // the Host header the JDK's client sends: no default port
            String hostHeader = port == -1 || port == ("https".equals(scheme) ? 443 : 80) ? uri.getHost() : uri.getHost() + ":" + port;
            String digest = hex(sha256(data));
            IOException last = null;
            for (int attempt = 0; attempt < 4; attempt++) {
                String stamp = STAMP.format(java.time.Instant.now());
                String names = "host;x-amz-content-sha256;x-amz-date" + (token == null ? "" : ";x-amz-security-token");
                String canonical = "PUT\n" + uriPath + "\n\nhost:" + hostHeader + "\nx-amz-content-sha256:" + digest
                    + "\nx-amz-date:" + stamp + "\n" + (token == null ? "" : "x-amz-security-token:" + token + "\n")
                    + "\n" + names + "\n" + digest;
                String scope = stamp.substring(0, 8) + "/" + region + "/s3/aws4_request";
                String toSign = "AWS4-HMAC-SHA256\n" + stamp + "\n" + scope + "\n" + hex(sha256(canonical.getBytes(StandardCharsets.UTF_8)));
                byte[] key = ("AWS4" + secretKey).getBytes(StandardCharsets.UTF_8);
                for (String part : new String[] {stamp.substring(0, 8), region, "s3", "aws4_request"}) {
                    key = hmac(key, part);
                }
                java.net.http.HttpRequest.Builder req = java.net.http.HttpRequest.newBuilder(uri)
                    .timeout(java.time.Duration.ofSeconds(60))
                    .PUT(java.net.http.HttpRequest.BodyPublishers.ofByteArray(data))
                    .header("x-amz-content-sha256", digest).header("x-amz-date", stamp)
                    .header("Authorization", "AWS4-HMAC-SHA256 Credential=" + accessKey + "/" + scope
                        + ", SignedHeaders=" + names + ", Signature=" + hex(hmac(key, toSign)));
                if (token != null) {
                    req.header("x-amz-security-token", token);
                }
                java.net.http.HttpResponse<String> resp;
                try {
                    Thread.sleep(attempt == 0 ? 0 : 100L << (attempt - 1));  // signed well inside S3's 15 min
                    resp = HTTP.send(req.build(), java.net.http.HttpResponse.BodyHandlers.ofString());
                } catch (IOException e) {
                    last = new IOException("PUT " + uri + " failed: " + e, e);
                    continue;
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new java.io.InterruptedIOException("PUT " + uri + " interrupted");
                }
                int status = resp.statusCode();
                if (status < 300) {
                    return;
                }
                String body = resp.body();
                last = new IOException("PUT " + uri + " failed: HTTP " + status
                    + (status == 401 || status == 403 ? " (check fs.s3a.access.key and fs.s3a.secret.key)" : "") + " "
                    + body.substring(0, Math.min(300, body.length())));
                if (status != 429 && status != 500 && (status < 502 || status > 504)) {
                    throw last;
                }
            }
            throw last;
        }

        /** AWS's URI encoding of a key's path: every byte but the unreserved ones and '/'. */
        static String encode(String path) {
            StringBuilder b = new StringBuilder();
            for (byte c : path.getBytes(StandardCharsets.UTF_8)) {
                int ch = c & 0xff;
                if ((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || "-_.~/".indexOf(ch) >= 0) {
                    b.append((char) ch);
                } else {
                    b.append('%').append(Character.toUpperCase(Character.forDigit(ch >> 4, 16)))
                        .append(Character.toUpperCase(Character.forDigit(ch & 15, 16)));
                }
            }
            return b.toString();
        }

        private static byte[] sha256(byte[] data) {
            try {
                return java.security.MessageDigest.getInstance("SHA-256").digest(data);
            } catch (java.security.NoSuchAlgorithmException e) {
                throw new IllegalStateException(e);
            }
        }

        private static byte[] hmac(byte[] key, String data) {
            try {
                javax.crypto.Mac mac = javax.crypto.Mac.getInstance("HmacSHA256");
                mac.init(new javax.crypto.spec.SecretKeySpec(key, "HmacSHA256"));
                return mac.doFinal(data.getBytes(StandardCharsets.UTF_8));
            } catch (java.security.GeneralSecurityException e) {
                throw new IllegalStateException(e);
            }
        }

        private static String hex(byte[] bytes) {
            StringBuilder b = new StringBuilder(bytes.length * 2);
            for (byte x : bytes) {
                b.append(Character.forDigit((x >> 4) & 15, 16)).append(Character.forDigit(x & 15, 16));
            }
            return b.toString();
        }
    }
}
