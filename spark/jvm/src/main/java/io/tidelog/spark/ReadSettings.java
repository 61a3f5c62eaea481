package io.tidelog.spark;

import java.io.Serializable;

/** How every task of one read pulls: the plan's settings, the same for all its ranges. */
final class ReadSettings implements Serializable {
  private static final long serialVersionUID = 1L;

  /** A pull's byte limit and long-poll wait, as the Python reader's (spark/fetch.py). */
  static final int PULL_MAX_BYTES = 8 << 20;

  static final int PULL_WAIT_MS = 1000;

  /** How long past its wait a pull may take before the next replica is asked (client/hedge.py). */
  static final int SPECULATIVE_MS = 500;

  final boolean failOnDataLoss;
  final int fetchMaxMessages;
  final long readTimeoutMs;
  final int readAhead;

  ReadSettings(boolean failOnDataLoss, int fetchMaxMessages, long readTimeoutMs, int readAhead) {
    this.failOnDataLoss = failOnDataLoss;
    this.fetchMaxMessages = fetchMaxMessages;
    this.readTimeoutMs = readTimeoutMs;
    this.readAhead = readAhead;
  }
}
