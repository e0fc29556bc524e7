package billing.jvm.debeziumcapture;

import java.lang.reflect.InvocationHandler;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Proxy;
import java.sql.Connection;
import java.sql.Driver;
import java.sql.DriverPropertyInfo;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.sql.SQLFeatureNotSupportedException;
import java.sql.Statement;
import java.util.Properties;
import java.util.logging.Logger;

/**
 * Lets Debezium's MySQL connector read a MariaDB server's binary log
 * position. Debezium 3.6.1 (MySqlConnection.resolveBinaryLogStatusStatement)
 * asks for SHOW BINARY LOG STATUS, MySQL 8.4's name, and when that fails it
 * falls back to SHOW MASTER STATUS only for a server whose VERSION() is
 * below 8.4, so MariaDB 10.11 (no SHOW BINARY LOG STATUS, VERSION()
 * 10.11.x) is refused: "MySQL version 10.11.19-MariaDB-0+deb12u1-log should
 * support SHOW BINARY LOG STATUS but it failed". Debezium's own MariaDB
 * connector, which would not need this, is not served by the Maven Central
 * this project reaches; a Connector/J query interceptor cannot do it either
 * (Debezium strips driver.queryInterceptors).
 *
 * This JDBC driver (database.jdbc.driver) is MySQL Connector/J with, on a
 * MariaDB server, that one statement renamed to SHOW MASTER STATUS, whose first columns
 * (File, Position, Binlog_Do_DB, Binlog_Ignore_DB) are the same; every other
 * statement reaches the server unchanged. The binary log itself is read by
 * Debezium's binlog client, which this does not touch.
 */
public final class MariaDbDriver implements Driver {
    private final Driver delegate = new com.mysql.cj.jdbc.Driver();

    public MariaDbDriver() throws SQLException {}

    static String rewrite(String sql) {
        if (sql != null && sql.trim().equalsIgnoreCase("SHOW BINARY LOG STATUS")) {
            return "SHOW MASTER STATUS";
        }
        return sql;
    }

    @Override
    public Connection connect(String url, Properties info) throws SQLException {
        Connection c = delegate.connect(url, info);
        if (c == null) {
            return null;
        }
        // MySQL 8.4 has SHOW BINARY LOG STATUS and no SHOW MASTER STATUS:
        // its connections stay as they are.
        if (!c.getMetaData().getDatabaseProductVersion().contains("MariaDB")) {
            return c;
        }
        return proxy(Connection.class, c);
    }

    /**
     * A proxy of target that renames the statement wherever SQL text enters
     * (prepareStatement, execute*, addBatch) and wraps the statements it
     * creates the same way.
     */
    private static <T> T proxy(Class<T> iface, T target) {
        InvocationHandler h = (p, m, args) -> {
            if (args != null && args.length > 0 && args[0] instanceof String s && m.getParameterTypes()[0] == String.class
                    && (m.getName().startsWith("prepare") || m.getName().startsWith("execute")
                            || m.getName().equals("addBatch"))) {
                args[0] = rewrite(s);
            }
            Object r;
            try {
                r = m.invoke(target, args);
            } catch (InvocationTargetException e) {
                throw e.getCause();
            }
            return wrapResult(m, r);
        };
        return iface.cast(Proxy.newProxyInstance(iface.getClassLoader(), new Class<?>[] {iface}, h));
    }

    private static Object wrapResult(Method m, Object r) {
        if (r instanceof PreparedStatement ps && m.getReturnType() == PreparedStatement.class) {
            return ps; // SQL already rewritten when it was prepared
        }
        if (r instanceof Statement st && m.getReturnType() == Statement.class) {
            return proxy(Statement.class, st);
        }
        return r;
    }

    @Override
    public boolean acceptsURL(String url) throws SQLException {
        return delegate.acceptsURL(url);
    }

    @Override
    public DriverPropertyInfo[] getPropertyInfo(String url, Properties info) throws SQLException {
        return delegate.getPropertyInfo(url, info);
    }

    @Override
    public int getMajorVersion() {
        return delegate.getMajorVersion();
    }

    @Override
    public int getMinorVersion() {
        return delegate.getMinorVersion();
    }

    @Override
    public boolean jdbcCompliant() {
        return delegate.jdbcCompliant();
    }

    @Override
    public Logger getParentLogger() throws SQLFeatureNotSupportedException {
        return delegate.getParentLogger();
    }
}
