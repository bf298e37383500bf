"""Delta Lake at the protocol level: log reader, table files, transactions, the JVM seam."""
