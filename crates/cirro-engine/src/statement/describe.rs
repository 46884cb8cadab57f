//! DESCRIBE and SHOW CREATE TABLE: a table's columns and distribution, and
//! the statements that make it as it is.

use std::sync::Arc;

use arrow::datatypes::{Field, Schema};
use cirro_common::Result;
use cirro_storage::CirroTable;
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::sqlparser::ast::ObjectName;

use crate::Engine;
use crate::statement::Outcome;
use crate::statement::ddl::open_named_table;

/// `DESCRIBE t`: DataFusion's rows, with a bucketed table's distribution
/// as a last row.
pub(crate) async fn describe(
    engine: &Engine,
    statement: &cirro_sql::Statement,
    table_name: &ObjectName,
) -> Result<Outcome> {
    let reference =
        datafusion::sql::planner::object_name_to_table_reference(table_name.clone(), true)?;
    // Views and system tables have no distribution.
    let table = open_named_table(engine, &reference).await.ok();
    let Some(sql) = statement.to_datafusion() else {
        return Err(cirro_common::CirroError::internal(
            "DESCRIBE without its statement",
        ));
    };
    let plan = engine.plan(sql).await?;
    engine.check_plan(&plan)?;
    if let LogicalPlan::DescribeTable(describe) = &plan {
        let distribution = table
            .as_ref()
            .and_then(|(_, t)| t.options().distribution.as_ref());
        let batch = describe_batch(describe, distribution)?;
        return engine.batch_rows(batch).await;
    }
    engine.execute_plan(plan).await
}

/// DESCRIBE's rows: each column's name, SQL type (DataFusion shows Arrow's
/// type names, Utf8View, Decimal128(8, 2)) and nullability; a bucketed
/// table's distribution as a last row (`DISTRIBUTED BY`, `HASH (…) BUCKETS n`).
pub(crate) fn describe_batch(
    describe: &datafusion::logical_expr::DescribeTable,
    distribution: Option<&cirro_storage::options::Distribution>,
) -> Result<arrow::array::RecordBatch> {
    let fields = describe.schema.fields();
    let mut names: Vec<String> = fields.iter().map(|f| f.name().clone()).collect();
    let mut types: Vec<String> = fields
        .iter()
        .map(|f| cirro_storage::schema::sql_type_name(f.data_type()))
        .collect();
    let mut nullable: Vec<String> = fields
        .iter()
        .map(|f| if f.is_nullable() { "YES" } else { "NO" }.to_string())
        .collect();
    if let Some(distribution) = distribution {
        names.push("DISTRIBUTED BY".into());
        types.push(
            distribution
                .definition()
                .trim_start_matches("DISTRIBUTED BY ")
                .to_string(),
        );
        nullable.push(String::new());
    }
    Ok(arrow::array::RecordBatch::try_new(
        Arc::new(describe.output_schema.as_arrow().clone()),
        vec![
            Arc::new(arrow::array::StringArray::from(names)),
            Arc::new(arrow::array::StringArray::from(types)),
            Arc::new(arrow::array::StringArray::from(nullable)),
        ],
    )?)
}

/// The columns DESCRIBE returns (DataFusion's).
pub(crate) fn describe_schema() -> arrow::datatypes::SchemaRef {
    use arrow::datatypes::DataType;
    Arc::new(Schema::new(vec![
        Field::new("column_name", DataType::Utf8, false),
        Field::new("data_type", DataType::Utf8, false),
        Field::new("is_nullable", DataType::Utf8, false),
    ]))
}

/// The columns SHOW CREATE TABLE returns.
pub(crate) fn show_create_schema() -> arrow::datatypes::SchemaRef {
    use arrow::datatypes::DataType;
    Arc::new(Schema::new(vec![
        Field::new("table_name", DataType::Utf8, false),
        Field::new("definition", DataType::Utf8, false),
    ]))
}

/// `SHOW CREATE TABLE name`: one row (`table_name`, `definition`) with the
/// statements that make the table as it is: CREATE TABLE with its columns,
/// constraints, options and distribution, then its CREATE INDEX statements.
pub(crate) async fn show_create_table(engine: &Engine, name: &ObjectName) -> Result<Outcome> {
    let reference = datafusion::sql::planner::object_name_to_table_reference(name.clone(), true)?;
    let (name, table) = open_named_table(engine, &reference).await?;
    let definition = create_table_text(&name, &table);
    let batch = arrow::array::RecordBatch::try_new(
        show_create_schema(),
        vec![
            Arc::new(arrow::array::StringArray::from(vec![name])),
            Arc::new(arrow::array::StringArray::from(vec![definition])),
        ],
    )?;
    engine.batch_rows(batch).await
}

/// The statements that create `table` as `name` (see [`show_create_table`]).
pub(crate) fn create_table_text(name: &str, table: &CirroTable) -> String {
    use cirro_storage::bucket::quote_ident;
    let options = table.options();
    let mut lines: Vec<String> = table
        .stored_schema()
        .fields()
        .iter()
        .map(|f| {
            format!(
                "    {} {}{}",
                quote_ident(f.name()),
                cirro_storage::schema::sql_type_name(f.data_type()),
                if f.is_nullable() { "" } else { " NOT NULL" }
            )
        })
        .collect();
    lines.extend(
        options
            .constraints
            .iter()
            .map(|c| format!("    CONSTRAINT {} {}", quote_ident(&c.name), c.definition())),
    );
    let mut text = format!(
        "CREATE TABLE {} (\n{}\n)",
        quote_ident(name),
        lines.join(",\n")
    );
    let mut with = Vec::new();
    if let Some(codec) = &options.compression {
        with.push(format!("compression = '{codec}'"));
    }
    if let Some(rows) = options.row_group_rows {
        with.push(format!("row_group_rows = {rows}"));
    }
    if !options.cluster_by.is_empty() {
        with.push(format!("cluster_by = '{}'", options.cluster_by.join(", ")));
    }
    if !with.is_empty() {
        text.push_str(&format!("\nWITH ({})", with.join(", ")));
    }
    if let Some(distribution) = &options.distribution {
        text.push_str(&format!("\n{}", distribution.definition()));
    }
    text.push(';');
    for index in &options.indexes {
        text.push_str(&format!("\n{};", index.definition(&quote_ident(name))));
    }
    text
}
