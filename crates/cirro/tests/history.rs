//! DESCRIBE HISTORY lists every commit of a table, newest first, with the
//! operation that made it and the files it added and removed.

use crate::common::DataDir;

#[test]
fn history_lists_every_commit_newest_first() {
    let data = DataDir::new();
    data.sql_ok("CREATE TABLE h (id INT, v VARCHAR)");
    data.sql_ok("INSERT INTO h VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')");
    data.sql_ok("DELETE FROM h WHERE id = 1");
    data.sql_ok("UPDATE h SET v = 'x' WHERE id = 2");
    data.sql_ok("MERGE INTO h USING (SELECT 9 AS id) s ON h.id = s.id WHEN NOT MATCHED THEN INSERT (id) VALUES (s.id)");
    data.sql_ok("TRUNCATE h");
    let out = data.sql_output("DESCRIBE HISTORY h", &["--format", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("json row"))
        .collect();
    let summary: Vec<(i64, String, i64, i64)> = rows
        .iter()
        .map(|r| {
            (
                r["version"].as_i64().expect("version"),
                r["operation"].as_str().unwrap_or_default().to_string(),
                r["files_added"].as_i64().expect("added"),
                r["files_removed"].as_i64().expect("removed"),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (5, "WRITE".to_string(), 0, 3),
            (4, "MERGE".to_string(), 1, 0),
            (3, "UPDATE".to_string(), 2, 1),
            (2, "DELETE".to_string(), 1, 1),
            (1, "WRITE".to_string(), 1, 0),
            (0, "CREATE TABLE".to_string(), 0, 0),
        ]
    );
    // commit times never go backwards
    let times: Vec<&str> = rows
        .iter()
        .map(|r| r["timestamp"].as_str().unwrap_or(""))
        .collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{times:?}");
}
