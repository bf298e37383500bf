package io.deltawheel.storage;

import java.io.IOException;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.s3a.S3AFileSystem;

/**
 * S3A ({@code fs.s3a.impl}) that answers the status of a Delta commit file this JVM has just
 * written without asking the store.
 *
 * <p>After its log store writes {@code _delta_log/N.json}, Delta asks the file system for that
 * file's status (a HEAD on S3A: a round trip on every commit) to take its length and modification
 * time. {@link ZkS3LogStore} keeps what it wrote; this class hands it over once instead. The
 * length is the bytes written, the time the moment the PUT returned, by this JVM's clock, not the
 * store's: it lives only in the snapshot Delta builds after the commit, and every listing of the
 * log (history, time travel, the next writer's snapshot) reads the store's own times. Any other
 * path, or the same file asked again, is S3A's.
 *
 * <p>The log store is found by name (its jar is built apart from this one): without it, this is S3A.
 */
public class CommitStatusS3AFileSystem extends S3AFileSystem {

    private static final MethodHandle TAKE_WRITTEN = find();

    private static MethodHandle find() {
        try {
            Class<?> store = Class.forName("io.deltawheel.storage.ZkS3LogStore", true,
                CommitStatusS3AFileSystem.class.getClassLoader());
            return MethodHandles.publicLookup().findStatic(store, "takeWritten",
                MethodType.methodType(FileStatus.class, Path.class));
        } catch (ReflectiveOperationException | LinkageError e) {
            return null;
        }
    }

    @Override
    public FileStatus getFileStatus(Path path) throws IOException {
        if (TAKE_WRITTEN != null && path.getName().endsWith(".json")) {
            FileStatus known;
            try {
                known = (FileStatus) TAKE_WRITTEN.invokeExact(makeQualified(path));
            } catch (Throwable e) {
                known = null;
            }
            if (known != null) {
                return known;
            }
        }
        return super.getFileStatus(path);
    }
}
