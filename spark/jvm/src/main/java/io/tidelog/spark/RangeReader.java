package io.tidelog.spark;

import java.io.Closeable;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Reads {@code [start, end)} of one queue, chunk by chunk, from whichever replica answers: the
 * JVM twin of spark/fetch.py {@code RangeReader}.
 *
 * <ul>
 *   <li>The range was planned below the confirmed offset, so every replica holds the same bytes
 *       for it. Replicas are asked in the planned order (slaves first); when one fails, times out,
 *       answers a replica error (UNAVAILABLE, TOPIC_NOT_FOUND, CORRUPT_RECORD) or has nothing there
 *       yet (it lags), reading continues from the same offset on the next. After every replica
 *       failed in a row it pauses 200 ms; once {@code readTimeout} passes without a chunk the read
 *       fails, naming the range, the replicas and the last error.
 *   <li>Offsets must arrive contiguous from the position, and nothing at or past {@code end} is
 *       ever returned.
 *   <li>A position below a replica's retention floor is data loss: an error with failOnDataLoss
 *       (unless the range starts at "earliest"), else the read skips to the floor (never past the
 *       end), as plan.py {@code check_start} decides. The floor comes from a one-record pull at
 *       {@code end - 1}, whose reply carries the replica's minimum offset.
 *   <li>Any other error a broker answers (PERMISSION_DENIED, INVALID_ARGUMENT, ...) fails the read
 *       at once.
 * </ul>
 */
final class RangeReader implements Closeable {
  private static final Logger log = LoggerFactory.getLogger(RangeReader.class);
  /** How long a pull's reply may take beyond its wait (the Python client's rpc timeout). */
  static final long REPLY_TIMEOUT_MS = 5000;

  static final long PAUSE_MS = 200;

  private final RangePartition range;
  private final ReadSettings settings;
  private final boolean failOnDataLoss;
  private final RecordChunk chunk;
  private final List<String> servedBy = new ArrayList<>();
  private long position;
  private int turn;
  private PullPipeline pipeline;

  RangeReader(RangePartition range, ReadSettings settings) {
    this.range = range;
    this.settings = settings;
    this.failOnDataLoss = settings.failOnDataLoss && !range.earliest;
    this.chunk = new RecordChunk(settings.fetchMaxMessages);
    this.position = range.start;
  }

  /** The next records of the range (at least one), or null once the range is read. */
  RecordChunk next() throws DataPortException {
    long deadline = System.currentTimeMillis() + settings.readTimeoutMs;
    DataPortException last = null;
    int failedInARow = 0;
    while (position < range.end) {
      long remaining = deadline - System.currentTimeMillis();
      if (remaining <= 0) {
        throw new DataPortException(
            "UNAVAILABLE",
            range.where() + ": could not read offsets " + position + ".." + range.end + " within "
                + settings.readTimeoutMs / 1000.0 + " s from " + Arrays.toString(range.replicas)
                + "; last error: " + (last == null ? "none" : last.getMessage())
                + " (check the broker set's replicas; the range is confirmed, so a retried task will"
                + " read the same rows)",
            false);
      }
      String address = range.replicas[turn % range.replicas.length];
      try {
        if (pull(address, remaining)) {
          return chunk;
        }
        failedInARow = 0; // a retention skip: go on from the new position
      } catch (DataPortException e) {
        if (!e.replicaError) {
          throw new DataPortException(e.code, range.where() + " at offset " + position + ": " + e.getMessage(), false);
        }
        last = e;
        closePipeline();
        turn++;
        failedInARow++;
        log.info("{}: {} could not serve offset {} ({}); trying the next replica", range.where(), address, position, e.getMessage());
        if (failedInARow >= range.replicas.length) {
          failedInARow = 0;
          sleep(Math.min(PAUSE_MS, Math.max(0, deadline - System.currentTimeMillis())));
        }
      }
    }
    if (servedBy.size() > 1) {
      log.info("{} [{}, {}) was served by {}", range.where(), range.start, range.end, servedBy);
    }
    return null;
  }

  /** One chunk from {@code address} into {@link #chunk}: true, or false after a retention skip. */
  private boolean pull(String address, long remaining) throws DataPortException {
    if (pipeline == null || !pipeline.conn.usable() || !pipeline.conn.address.equals(address)) {
      closePipeline();
      pipeline = new PullPipeline(DataPortConnection.open(address, remaining));
    }
    pipeline.fill(
        range.topic, range.queue, position, range.end, 1 + settings.readAhead, settings.fetchMaxMessages, remaining);
    PullPipeline.InFlight head = pipeline.head();
    DataPortConnection.Frame f = pipeline.take(Math.min(remaining, head.waitMs + REPLY_TIMEOUT_MS));
    if (f.status != Frames.OK) {
      DataPortException e = Frames.error(f.body, address);
      if (e.code.equals("OFFSET_BELOW_RETENTION")) {
        pipeline.drop();
        skipDeleted(address, remaining);
        return false;
      }
      throw e;
    }
    try {
      chunk.fill(f.body, address, head.offset, range.queue, (int) Math.min(head.count, range.end - head.offset));
    } catch (DataPortException e) {
      if (e.replicaError && e.code.equals("UNAVAILABLE") && head.waitMs == 0) {
        // a pull ahead that found nothing yet: ask this replica again, long-polling, before the next
        pipeline.drop();
        return pull(address, remaining);
      }
      throw e;
    }
    checkContiguous(address);
    if (chunk.size < head.count) {
      pipeline.drop(); // the pulls after this one start past where it ended
    }
    if (servedBy.isEmpty() || !servedBy.get(servedBy.size() - 1).startsWith(address + "@")) {
      servedBy.add(address + "@" + position);
    }
    position += chunk.size;
    return true;
  }

  private void checkContiguous(String address) throws DataPortException {
    for (int i = 0; i < chunk.size; i++) {
      if (chunk.offsets[i] != position + i) {
        throw new DataPortException(
            "LOCAL",
            range.where() + ": " + address + " returned offset " + chunk.offsets[i] + " as record " + i
                + " of a read at " + position + " (" + chunk.size + " messages); queue offsets must be contiguous",
            false);
      }
    }
  }

  /** The position is below the replica's retention floor: fail (failOnDataLoss) or skip to it. */
  private void skipDeleted(String address, long remaining) throws DataPortException {
    long floor = range.end; // when even end - 1 is gone, the whole rest of the range is
    int rid = pipeline.conn.sendPull(range.topic, range.queue, range.end - 1, 1, 0);
    DataPortConnection.Frame f;
    do {
      f = pipeline.conn.read(Math.min(remaining, REPLY_TIMEOUT_MS));
    } while (f.rid != rid);
    if (f.status == Frames.OK) {
      if (f.body.length < Frames.PULLED_SIZE) {
        throw DataPortException.corrupt(address, range.end - 1, "a pull reply is shorter than its fields");
      }
      floor = Math.min(RecordChunk.i64(f.body, 8), range.end);
    } else {
      DataPortException e = Frames.error(f.body, address);
      if (!e.code.equals("OFFSET_BELOW_RETENTION")) {
        throw e;
      }
    }
    if (floor <= position) {
      throw DataPortException.unavailable(
          address + " answered OFFSET_BELOW_RETENTION at " + position + " but its minimum is " + floor);
    }
    if (failOnDataLoss) {
      throw new DataPortException(
          "OFFSET_BELOW_RETENTION",
          range.where() + ": start offset " + position + " is below the log's minimum offset " + floor
              + (floor == range.end ? " or more" : "")
              + " (retention deleted these messages; start from the current minimum, or set"
              + " failOnDataLoss=false to skip ahead)",
          false);
    }
    log.warn(
        "{}: offsets {}..{} were deleted by retention; skipping to {} (failOnDataLoss=false)",
        range.where(), position, floor, floor);
    position = floor;
  }

  private void closePipeline() {
    if (pipeline != null) {
      pipeline.close();
      pipeline = null;
    }
  }

  private static void sleep(long ms) throws DataPortException {
    try {
      Thread.sleep(ms);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new DataPortException("UNAVAILABLE", "the read was interrupted", false);
    }
  }

  @Override
  public void close() {
    closePipeline();
  }
}
