package io.tidelog.spark;

/** A "host:port" address as the cluster reports it (IPv6 hosts in brackets). */
final class Address {
  final String host;
  final int port;

  private Address(String host, int port) {
    this.host = host;
    this.port = port;
  }

  static boolean valid(String text) {
    try {
      parse(text);
      return true;
    } catch (IllegalArgumentException e) {
      return false;
    }
  }

  static Address parse(String text) {
    int colon = text.lastIndexOf(':');
    if (colon <= 0 || colon == text.length() - 1) {
      throw new IllegalArgumentException("not a host:port address: " + text);
    }
    String host = text.substring(0, colon);
    if (host.startsWith("[") && host.endsWith("]")) {
      host = host.substring(1, host.length() - 1);
    }
    int port;
    try {
      port = Integer.parseInt(text.substring(colon + 1));
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException("not a host:port address: " + text);
    }
    if (port < 1 || port > 65535 || host.isEmpty()) {
      throw new IllegalArgumentException("not a host:port address: " + text);
    }
    return new Address(host, port);
  }
}
