package io.deltawheel.storage;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.util.Iterator;
import java.util.UUID;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;

import io.delta.storage.HadoopFileSystemLogStore;

/**
 * Delta log store for local file systems (scheme {@code file}) whose put-if-absent holds across
 * processes.
 *
 * <p>Delta's own stores for local paths ({@code HDFSLogStore}, {@code LocalLogStore}) check that
 * the commit file does not exist and then rename a temporary file onto it, inside a JVM-wide lock.
 * The local rename replaces an existing file, so two processes committing the same version of a
 * table at the same moment can both succeed, the later silently replacing the earlier commit.
 * Here the commit file is made with a hard link from the finished temporary file: the link fails
 * with {@link FileAlreadyExistsException} if the version exists, atomically in the kernel, whatever
 * process made it. (It also avoids Hadoop's local {@code FileContext}, which forks {@code chmod}
 * and {@code readlink} per file when Hadoop's native library is missing.)
 *
 * <p>Overwrites (Delta's {@code _last_checkpoint}) are an atomic replacing move. A file system
 * without hard links falls back to the JVM-locked check-then-move of Delta's stores.
 */
public class ExclusiveLocalLogStore extends HadoopFileSystemLogStore {

    public ExclusiveLocalLogStore(Configuration initHadoopConf) {
        super(initHadoopConf);
    }

    @Override
    public void write(org.apache.hadoop.fs.Path path, Iterator<String> actions, Boolean overwrite,
                      Configuration hadoopConf) throws IOException {
        FileSystem fs = path.getFileSystem(hadoopConf);
        Path target = Paths.get(fs.makeQualified(path).toUri());
        Path dir = target.getParent();
        if (dir == null || !Files.isDirectory(dir)) {
            throw new FileNotFoundException("No such file or directory: " + dir);
        }
        Path tmp = dir.resolve("." + target.getFileName() + "." + UUID.randomUUID() + ".tmp");
        try {
            try (Writer w = Files.newBufferedWriter(tmp, StandardCharsets.UTF_8,
                    StandardOpenOption.CREATE_NEW, StandardOpenOption.WRITE)) {
                while (actions.hasNext()) {
                    w.write(actions.next());
                    w.write('\n');
                }
            }
            if (overwrite) {
                Files.move(tmp, target, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
                return;
            }
            try {
                Files.createLink(target, tmp);
            } catch (FileAlreadyExistsException e) {
                throw new FileAlreadyExistsException(path.toString());
            } catch (UnsupportedOperationException e) {
                moveIfAbsent(tmp, target, path);
            }
        } finally {
            Files.deleteIfExists(tmp);
        }
    }

    private static synchronized void moveIfAbsent(Path tmp, Path target, org.apache.hadoop.fs.Path path)
            throws IOException {
        if (Files.exists(target)) {
            throw new FileAlreadyExistsException(path.toString());
        }
        Files.move(tmp, target, StandardCopyOption.ATOMIC_MOVE);
    }

    @Override
    public Boolean isPartialWriteVisible(org.apache.hadoop.fs.Path path, Configuration hadoopConf) {
        return true;  // as Delta's local stores: checkpoints are written to a temporary name first
    }
}
