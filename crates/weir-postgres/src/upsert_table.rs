//! The table an upsert sink writes: its columns checked against the catalog at start-up,
//! and a collapsed batch of rows written as multi-row `INSERT ... ON CONFLICT DO UPDATE`
//! and `DELETE` statements. Knows nothing of checkpoints or of the APPLY protocol.

use crate::apply::check_identifier;
use crate::describe;
use crate::sink::SqlParams;
use postgres::GenericClient;
use postgres::types::ToSql;

/// Most parameters one statement binds (PostgreSQL's limit is 65535).
const MAX_PARAMS: usize = 30_000;
/// Most rows one statement writes.
const MAX_ROWS: usize = 1_000;

/// A table with the columns a key and a value map to.
#[derive(Debug, Clone)]
pub(crate) struct TableSpec {
    pub table: String,
    pub key_columns: Vec<String>,
    pub value_columns: Vec<String>,
}

/// Why a batch could not be written.
#[derive(Debug)]
pub(crate) enum WriteError {
    /// The database failed (retried or not by its SQLSTATE).
    Db(postgres::Error),
    /// The user's mapping does not fit the table: wrong number of parameters, a Rust type
    /// that does not convert to the column's type. Never retried.
    Mapping(String),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::Db(e) => write!(f, "database error: {}", describe(e)),
            WriteError::Mapping(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for WriteError {}

impl TableSpec {
    /// Checks the names without a server: plain identifiers, at least one key column, no
    /// column twice.
    pub fn validate(&self) -> Result<(), String> {
        check_identifier(&self.table)?;
        if self.key_columns.is_empty() {
            return Err(format!(
                "no key columns for table '{}': name them with .key_columns(&[\"id\"], |k| ...)",
                self.table
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for c in self.key_columns.iter().chain(&self.value_columns) {
            if c.contains('.') {
                return Err(format!(
                    "column '{c}' must be a plain column name, without a table"
                ));
            }
            check_identifier(c).map_err(|_| {
                format!("'{c}' is not a plain SQL column name (letters, digits and '_')")
            })?;
            if !seen.insert(c.to_ascii_lowercase()) {
                return Err(format!(
                    "column '{c}' is named twice (key and value columns must be distinct)"
                ));
            }
        }
        Ok(())
    }

    fn columns_list(&self) -> String {
        self.key_columns
            .iter()
            .chain(&self.value_columns)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Checks the table against the catalog: it exists, has every column, and has a primary
    /// key or unique constraint on exactly the key columns (which `ON CONFLICT` needs).
    pub fn check(&self, client: &mut impl GenericClient) -> Result<(), String> {
        let t = &self.table;
        let db = |e: postgres::Error| format!("cannot read the catalog: {}", describe(&e));
        let exists: Option<String> = client
            .query_one("SELECT to_regclass($1)::text", &[t])
            .map_err(db)?
            .get(0);
        if exists.is_none() {
            return Err(format!(
                "table '{t}' does not exist; create it first, with a primary key on the key \
                 columns, e.g. CREATE TABLE {t} ({} ... PRIMARY KEY, {} ...)",
                self.key_columns.join(" ..., "),
                self.value_columns.join(" ..., ")
            ));
        }
        let have: Vec<String> = client
            .query(
                "SELECT attname::text FROM pg_attribute
                 WHERE attrelid = $1::text::regclass AND attnum > 0 AND NOT attisdropped
                 ORDER BY attnum",
                &[t],
            )
            .map_err(db)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        for (what, cols) in [("key", &self.key_columns), ("value", &self.value_columns)] {
            for c in cols {
                if !have.iter().any(|h| h == &c.to_ascii_lowercase()) {
                    return Err(format!(
                        "table '{t}' has no column '{c}' (named as a {what} column); its columns \
                         are: {}",
                        have.join(", ")
                    ));
                }
            }
        }
        let unique: Vec<Vec<String>> = client
            .query(
                "SELECT array_agg(a.attname::text ORDER BY a.attname)
                 FROM pg_index i JOIN pg_attribute a
                   ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
                 WHERE i.indrelid = $1::text::regclass AND i.indisunique
                   AND i.indpred IS NULL AND i.indexprs IS NULL
                 GROUP BY i.indexrelid",
                &[t],
            )
            .map_err(db)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut want: Vec<String> = self
            .key_columns
            .iter()
            .map(|c| c.to_ascii_lowercase())
            .collect();
        want.sort();
        if !unique.contains(&want) {
            let keys = self.key_columns.join(", ");
            return Err(format!(
                "table '{t}' has no primary key or unique constraint on exactly ({keys}), which \
                 INSERT ... ON CONFLICT ({keys}) needs; add one, e.g. ALTER TABLE {t} ADD PRIMARY \
                 KEY ({keys})"
            ));
        }
        Ok(())
    }

    /// Writes `upserts` (key and value parameters) and `deletes` (key parameters) with as few
    /// statements as the parameter limit allows. Each key occurs at most once in both.
    pub fn write(
        &self,
        client: &mut impl GenericClient,
        upserts: &[(SqlParams, SqlParams)],
        deletes: &[SqlParams],
    ) -> Result<(), WriteError> {
        let (nk, nv) = (self.key_columns.len(), self.value_columns.len());
        let per_row = nk + nv;
        for (k, v) in upserts {
            self.check_arity(k.len(), v.len())?;
        }
        for k in deletes {
            self.check_arity(k.len(), nv)?;
        }
        let rows = (MAX_PARAMS / per_row).clamp(1, MAX_ROWS);
        for chunk in upserts.chunks(rows) {
            let sql = self.upsert_sql(chunk.len());
            let params: Vec<&(dyn ToSql + Sync)> = chunk
                .iter()
                .flat_map(|(k, v)| k.iter().chain(v.iter()))
                .map(|b| &**b as &(dyn ToSql + Sync))
                .collect();
            client
                .execute(sql.as_str(), &params)
                .map_err(|e| self.classify(e))?;
        }
        let rows = (MAX_PARAMS / nk).clamp(1, MAX_ROWS);
        for chunk in deletes.chunks(rows) {
            let sql = self.delete_sql(chunk.len());
            let params: Vec<&(dyn ToSql + Sync)> = chunk
                .iter()
                .flat_map(|k| k.iter())
                .map(|b| &**b as &(dyn ToSql + Sync))
                .collect();
            client
                .execute(sql.as_str(), &params)
                .map_err(|e| self.classify(e))?;
        }
        Ok(())
    }

    fn check_arity(&self, keys: usize, values: usize) -> Result<(), WriteError> {
        if keys != self.key_columns.len() {
            return Err(WriteError::Mapping(format!(
                "the key mapping gave {keys} value(s) for the {} key column(s) ({}) of table '{}'",
                self.key_columns.len(),
                self.key_columns.join(", "),
                self.table
            )));
        }
        if values != self.value_columns.len() {
            return Err(WriteError::Mapping(format!(
                "the value mapping gave {values} value(s) for the {} value column(s) ({}) of \
                 table '{}'",
                self.value_columns.len(),
                self.value_columns.join(", "),
                self.table
            )));
        }
        Ok(())
    }

    /// A parameter that does not convert to its column's type is the mapping's fault, not
    /// something a retry fixes.
    fn classify(&self, e: postgres::Error) -> WriteError {
        let text = e.to_string();
        if e.code().is_none() && !e.is_closed() && text.starts_with("error serializing parameter") {
            WriteError::Mapping(format!(
                "a value does not fit its column in table '{}' (columns, in parameter order: \
                 {}): {}; map it to the Rust type of the column's SQL type (BIGINT: i64, \
                 INTEGER: i32, TEXT: String, DOUBLE PRECISION: f64, ...)",
                self.table,
                self.columns_list(),
                describe(&e)
            ))
        } else {
            WriteError::Db(e)
        }
    }

    /// `INSERT INTO t (k.., v..) VALUES (..), .. ON CONFLICT (k..) DO UPDATE SET v = EXCLUDED.v`
    pub fn upsert_sql(&self, rows: usize) -> String {
        let per_row = self.key_columns.len() + self.value_columns.len();
        let keys = self.key_columns.join(", ");
        let conflict = if self.value_columns.is_empty() {
            "DO NOTHING".to_string()
        } else {
            let set: Vec<String> = self
                .value_columns
                .iter()
                .map(|c| format!("{c} = EXCLUDED.{c}"))
                .collect();
            format!("DO UPDATE SET {}", set.join(", "))
        };
        format!(
            "INSERT INTO {} ({}) VALUES {} ON CONFLICT ({keys}) {conflict}",
            self.table,
            self.columns_list(),
            placeholders(rows, per_row)
        )
    }

    /// `DELETE FROM t WHERE (k..) IN ((..), ..)`
    pub fn delete_sql(&self, rows: usize) -> String {
        let n = self.key_columns.len();
        format!(
            "DELETE FROM {} WHERE ({}) IN ({})",
            self.table,
            self.key_columns.join(", "),
            placeholders(rows, n)
        )
    }
}

/// `($1, $2), ($3, $4)` for 2 rows of 2.
fn placeholders(rows: usize, per_row: usize) -> String {
    let mut s = String::with_capacity(rows * per_row * 5);
    for r in 0..rows {
        if r > 0 {
            s.push_str(", ");
        }
        s.push('(');
        for c in 0..per_row {
            if c > 0 {
                s.push_str(", ");
            }
            s.push('$');
            s.push_str(&(r * per_row + c + 1).to_string());
        }
        s.push(')');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(keys: &[&str], values: &[&str]) -> TableSpec {
        TableSpec {
            table: "shop.totals".into(),
            key_columns: keys.iter().map(|s| s.to_string()).collect(),
            value_columns: values.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn statements_bind_rows_in_order() {
        let s = spec(&["region", "account"], &["total"]);
        assert_eq!(
            s.upsert_sql(2),
            "INSERT INTO shop.totals (region, account, total) VALUES ($1, $2, $3), ($4, $5, $6) \
             ON CONFLICT (region, account) DO UPDATE SET total = EXCLUDED.total"
        );
        assert_eq!(
            s.delete_sql(2),
            "DELETE FROM shop.totals WHERE (region, account) IN (($1, $2), ($3, $4))"
        );
        assert_eq!(
            spec(&["id"], &[]).upsert_sql(1),
            "INSERT INTO shop.totals (id) VALUES ($1) ON CONFLICT (id) DO NOTHING"
        );
    }

    #[test]
    fn names_are_checked() {
        assert!(spec(&["id"], &["v"]).validate().is_ok());
        let e = spec(&[], &["v"]).validate().unwrap_err();
        assert!(e.contains("no key columns"), "{e}");
        let e = spec(&["id"], &["ID"]).validate().unwrap_err();
        assert!(e.contains("named twice"), "{e}");
        let e = spec(&["id"], &["v; drop"]).validate().unwrap_err();
        assert!(e.contains("not a plain SQL column name"), "{e}");
        let e = spec(&["t.id"], &[]).validate().unwrap_err();
        assert!(e.contains("plain column name"), "{e}");
    }
}
