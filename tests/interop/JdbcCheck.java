// The PostgreSQL JDBC driver against `cirro serve`: DatabaseMetaData
// (getTables, getColumns), PreparedStatement with parameters, batch insert,
// ResultSet types, transactions. Run by crates/cirro/tests/server.rs as
//   java -cp postgresql.jar JdbcCheck.java URL USER PASSWORD
// Prints "ok" when every check passed; throws otherwise.
//

import java.math.BigDecimal;
import java.sql.*;
import java.time.LocalDate;
import java.util.*;

public class JdbcCheck {
    static void check(Object got, Object want, String what) {
        if (!Objects.equals(got, want)) {
            throw new AssertionError(what + ": got " + got + ", want " + want);
        }
    }

    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.setProperty("user", args[1]);
        props.setProperty("password", args[2]);
        try (Connection conn = DriverManager.getConnection(args[0], props)) {
            try (Statement st = conn.createStatement()) {
                st.execute("CREATE TABLE jdbc_items (id BIGINT NOT NULL, name VARCHAR, price DECIMAL(10, 2),"
                        + " qty INT, ok BOOLEAN, day DATE, score DOUBLE)");
            }

            // Batch insert through a prepared statement with parameters.
            try (PreparedStatement ps = conn.prepareStatement(
                    "INSERT INTO jdbc_items VALUES (?, ?, ?, ?, ?, ?, ?)")) {
                for (int i = 1; i <= 50; i++) {
                    ps.setLong(1, i);
                    if (i % 10 == 0) ps.setNull(2, Types.VARCHAR); else ps.setString(2, "item " + i);
                    ps.setBigDecimal(3, new BigDecimal(i + ".25"));
                    ps.setInt(4, i * 2);
                    ps.setBoolean(5, i % 2 == 0);
                    ps.setDate(6, java.sql.Date.valueOf(LocalDate.of(2024, 1, 1).plusDays(i)));
                    ps.setDouble(7, i / 4.0);
                    ps.addBatch();
                }
                int[] counts = ps.executeBatch();
                check(counts.length, 50, "batch size");
                check(Arrays.stream(counts).sum(), 50, "batch row counts");
            }

            // Parameters in a query; ResultSet types.
            try (PreparedStatement ps = conn.prepareStatement(
                    "SELECT id, name, price, qty, ok, day, score FROM jdbc_items WHERE id BETWEEN ? AND ? ORDER BY id")) {
                ps.setLong(1, 9);
                ps.setLong(2, 10);
                try (ResultSet rs = ps.executeQuery()) {
                    check(rs.next(), true, "first row");
                    check(rs.getLong("id"), 9L, "BIGINT");
                    check(rs.getString("name"), "item 9", "VARCHAR");
                    check(rs.getBigDecimal("price"), new BigDecimal("9.25"), "DECIMAL");
                    check(rs.getInt("qty"), 18, "INT");
                    check(rs.getBoolean("ok"), false, "BOOLEAN");
                    check(rs.getDate("day").toLocalDate(), LocalDate.of(2024, 1, 10), "DATE");
                    check(rs.getDouble("score"), 2.25, "DOUBLE");
                    check(rs.next(), true, "second row");
                    check(rs.getString("name"), null, "NULL VARCHAR");
                    check(rs.wasNull(), true, "wasNull");
                    check(rs.next(), false, "two rows");
                    ResultSetMetaData md = rs.getMetaData();
                    check(md.getColumnCount(), 7, "column count");
                    check(md.getColumnType(1), Types.BIGINT, "BIGINT type");
                    check(md.getColumnType(4), Types.INTEGER, "INT type");
                    check(md.getColumnType(5), Types.BIT, "BOOLEAN type");
                    check(md.getColumnType(6), Types.DATE, "DATE type");
                }
            }

            // Updates report their counts; a transaction rolls back.
            try (PreparedStatement ps = conn.prepareStatement("UPDATE jdbc_items SET qty = qty + ? WHERE ok = ?")) {
                ps.setInt(1, 1);
                ps.setBoolean(2, true);
                check(ps.executeUpdate(), 25, "UPDATE count");
            }
            conn.setAutoCommit(false);
            try (Statement st = conn.createStatement()) {
                check(st.executeUpdate("DELETE FROM jdbc_items WHERE id > 40"), 10, "DELETE count");
                conn.rollback();
                try (ResultSet rs = st.executeQuery("SELECT count(*) FROM jdbc_items")) {
                    rs.next();
                    check(rs.getLong(1), 50L, "rolled back");
                }
            }
            conn.setAutoCommit(true);

            // Parameters never become SQL text: an injection attempt, bound
            // through a server-side prepared statement (prepareThreshold=1
            // on the URL), is stored verbatim and the table survives.
            String injection = "'); DROP TABLE jdbc_items; --";
            try (PreparedStatement ps = conn.prepareStatement("INSERT INTO jdbc_items (id, name) VALUES (?, ?)")) {
                for (int i = 0; i < 3; i++) {
                    ps.setLong(1, 1000 + i);
                    ps.setString(2, injection);
                    check(ps.executeUpdate(), 1, "INSERT with an injection attempt");
                }
            }
            try (PreparedStatement ps = conn.prepareStatement("SELECT name FROM jdbc_items WHERE id = ?")) {
                ps.setLong(1, 1002);
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    check(rs.getString(1), injection, "injection text read back verbatim");
                }
            }
            try (Statement st = conn.createStatement()) {
                st.executeUpdate("DELETE FROM jdbc_items WHERE id >= 1000");
                try (ResultSet rs = st.executeQuery("SELECT count(*) FROM jdbc_items")) {
                    rs.next();
                    check(rs.getLong(1), 50L, "jdbc_items survives");
                }
            }

            // Errors carry their SQLSTATE.
            try (Statement st = conn.createStatement()) {
                st.executeQuery("SELECT * FROM no_such_table");
                throw new AssertionError("no error");
            } catch (SQLException e) {
                check(e.getSQLState(), "42P01", "SQLSTATE");
            }

            // DatabaseMetaData.
            DatabaseMetaData meta = conn.getMetaData();
            check(meta.getDatabaseProductName(), "PostgreSQL", "product name");
            List<String> tables = new ArrayList<>();
            try (ResultSet rs = meta.getTables(null, "public", "jdbc%", new String[] {"TABLE"})) {
                while (rs.next()) tables.add(rs.getString("TABLE_NAME"));
            }
            check(tables, List.of("jdbc_items"), "getTables");
            List<String> columns = new ArrayList<>();
            Map<String, Integer> types = new HashMap<>();
            try (ResultSet rs = meta.getColumns(null, "public", "jdbc_items", null)) {
                while (rs.next()) {
                    columns.add(rs.getString("COLUMN_NAME"));
                    types.put(rs.getString("COLUMN_NAME"), rs.getInt("DATA_TYPE"));
                }
            }
            check(columns, List.of("id", "name", "price", "qty", "ok", "day", "score"), "getColumns");
            check(types.get("id"), Types.BIGINT, "getColumns BIGINT");
            check(types.get("price"), Types.NUMERIC, "getColumns NUMERIC");
        }
        System.out.println("ok");
    }
}
