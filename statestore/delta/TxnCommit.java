package io.deltawheel.delta;

import java.util.ArrayList;
import java.util.List;

import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.delta.DeltaOperations;
import org.apache.spark.sql.delta.OptimisticTransaction;
import org.apache.spark.sql.delta.actions.Action;
import org.apache.spark.sql.delta.actions.Action$;
import org.apache.spark.sql.delta.actions.AddFile;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The end of one Delta transaction opened from Python ({@code statestore/delta/txn.py},
 * {@code TableLog.commit}) in one py4j call: what is recorded as read, the removes, the adds and
 * the commit. From Python each action, each list and each Scala conversion was a round trip of
 * its own, 15-25 per commit, and with 16 writers sharing one driver each round trip took
 * milliseconds (docs/scale.md, "Fewer py4j round trips").
 *
 * <p>The transaction is Delta's own: its snapshot, its conflict checks and its log store are
 * unchanged; this class only does in the JVM what the Python side did through py4j.
 */
public final class TxnCommit {

    private TxnCommit() {
    }

    /**
     * Commit {@code txn}: record {@code predicates} (partition predicates, may be null) as read,
     * remove the files of {@code removes} (their {@code add} action JSON, one a line; recorded as
     * read too), add the actions of {@code adds} (action JSON, one a line: {@code add}, {@code txn}).
     *
     * @return the committed version
     */
    public static long commit(OptimisticTransaction txn, scala.collection.immutable.Seq<Expression> predicates,
                              String removes, String adds, DeltaOperations.Operation op, long nowMs) {
        if (predicates != null) {
            // (partitionOnly, shouldRewriteFilter): unrewritten, the conflict check raises AnalysisException
            txn.trackReadPredicates(predicates, true, true);
        }
        List<Action> actions = new ArrayList<>();
        List<AddFile> read = new ArrayList<>();
        for (String line : removes.split("\n")) {
            if (!line.isEmpty()) {
                read.add((AddFile) Action$.MODULE$.fromJson(line));
            }
        }
        if (!read.isEmpty()) {
            txn.trackFilesRead(seq(read));
            for (AddFile file : read) {
                actions.add(file.removeWithTimestamp(nowMs, true));
            }
        }
        for (String line : adds.split("\n")) {
            if (!line.isEmpty()) {
                actions.add(Action$.MODULE$.fromJson(line));
            }
        }
        return txn.commit(seq(actions), op);
    }

    private static <T> scala.collection.immutable.Seq<T> seq(List<T> items) {
        return CollectionConverters.asScala(items).toSeq();
    }
}
