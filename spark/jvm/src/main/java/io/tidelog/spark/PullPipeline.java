package io.tidelog.spark;

import java.io.Closeable;
import java.util.ArrayDeque;
import java.util.HashMap;
import java.util.Map;

/**
 * Pulls of one range kept in flight on one data connection, so that the replica reads and sends
 * the next records while the task turns the current ones into columns (the Python reader's read
 * ahead, client/aio.py {@code ReadAhead}). A pull of a confirmed range brings exactly the records
 * it asks for unless its byte limit is reached first, so the offset of the next one is known; when
 * a reply brings fewer, the pulls after it are dropped (their replies are read and discarded) and
 * pulling starts again where the reply ended.
 *
 * <p>The first pull after a start or a drop long-polls (its wait, as the Python reader's hedged
 * pull); the ones ahead of it do not wait.
 */
final class PullPipeline implements Closeable {
  /** A pull sent and not answered yet. */
  static final class InFlight {
    final int rid;
    final long offset;
    final int count;
    final int waitMs;

    InFlight(int rid, long offset, int count, int waitMs) {
      this.rid = rid;
      this.offset = offset;
      this.count = count;
      this.waitMs = waitMs;
    }
  }

  final DataPortConnection conn;
  private final ArrayDeque<InFlight> inFlight = new ArrayDeque<>();
  /** Replies that overtook the one awaited, by request id. */
  private final Map<Integer, DataPortConnection.Frame> early = new HashMap<>();
  private long nextOffset;

  PullPipeline(DataPortConnection conn) {
    this.conn = conn;
  }

  /** Pulls in flight from {@code position} towards {@code end}, up to {@code depth} of them. */
  void fill(String topic, int queue, long position, long end, int depth, int maxMessages, long remainingMs)
      throws DataPortException {
    if (inFlight.isEmpty() || inFlight.peekFirst().offset != position) {
      drop();
      nextOffset = position;
    }
    while (inFlight.size() < depth && nextOffset < end) {
      int count = (int) Math.min(maxMessages, end - nextOffset);
      int waitMs = inFlight.isEmpty() ? (int) Math.min(ReadSettings.PULL_WAIT_MS, remainingMs) : 0;
      int rid = conn.sendPull(topic, queue, nextOffset, count, waitMs);
      inFlight.addLast(new InFlight(rid, nextOffset, count, waitMs));
      nextOffset += count;
    }
  }

  /** The first pull in flight, whose reply {@link #take} returns next. */
  InFlight head() {
    return inFlight.peekFirst();
  }

  /** The reply of the first pull in flight; it waits at most {@code timeoutMs} for it. */
  DataPortConnection.Frame take(long timeoutMs) throws DataPortException {
    InFlight want = inFlight.pollFirst();
    DataPortConnection.Frame f = early.remove(want.rid);
    long deadline = System.currentTimeMillis() + timeoutMs;
    while (f == null) {
      DataPortConnection.Frame got = conn.read(Math.max(1, deadline - System.currentTimeMillis()));
      if (got.rid == want.rid) {
        f = got;
      } else if (isInFlight(got.rid)) {
        early.put(got.rid, got);
      } // else: the reply of a dropped pull
    }
    return f;
  }

  private boolean isInFlight(int rid) {
    for (InFlight p : inFlight) {
      if (p.rid == rid) {
        return true;
      }
    }
    return false;
  }

  /** Forget every pull in flight (their replies will be discarded as they arrive). */
  void drop() {
    inFlight.clear();
    early.clear();
  }

  @Override
  public void close() {
    drop();
    conn.close();
  }
}
