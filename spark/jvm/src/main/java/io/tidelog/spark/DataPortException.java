package io.tidelog.spark;

import java.io.IOException;

/**
 * A read that failed, with the tidelog error code when a broker answered one (tidelog/errors.py)
 * and whether another replica, or a later try, may still serve the same offsets.
 */
final class DataPortException extends IOException {
  private static final long serialVersionUID = 1L;

  /** The broker's error code, or LOCAL for a failure seen on this side (a lost connection, a bad reply). */
  final String code;

  /** UNAVAILABLE, TOPIC_NOT_FOUND, CORRUPT_RECORD and lost connections: "this replica, not now". */
  final boolean replicaError;

  DataPortException(String code, String message, boolean replicaError) {
    super(message);
    this.code = code;
    this.replicaError = replicaError;
  }

  DataPortException(String message, Throwable cause) {
    super(message, cause);
    this.code = "UNAVAILABLE";
    this.replicaError = true;
  }

  /** The codes fetch.py passes over to the next replica (its {@code _REPLICA_ERRORS}). */
  static boolean isReplicaCode(String code) {
    return code.equals("UNAVAILABLE") || code.equals("TOPIC_NOT_FOUND") || code.equals("CORRUPT_RECORD");
  }

  static DataPortException corrupt(String address, long offset, String reason) {
    return new DataPortException(
        "CORRUPT_RECORD", "pull reply from " + address + " at offset " + offset + ": " + reason, true);
  }

  static DataPortException unavailable(String message) {
    return new DataPortException("UNAVAILABLE", message, true);
  }
}
