//! The test server, a schema per test, and plain-SQL checks that do not go through weir.

use std::sync::OnceLock;
use weir_postgres::postgres::{Client, NoTls};

/// The server's URL: `WEIR_POSTGRES_URL`, or one started once with `scripts/postgres.sh`
/// (state in the system's temporary directory, which the server's `postgres` user can reach
/// when the tests run as root; `start` is idempotent, so later runs reuse it).
pub fn url() -> &'static str {
    static U: OnceLock<String> = OnceLock::new();
    U.get_or_init(|| {
        let dir = std::env::temp_dir().join("weir-test-postgres");
        weir_tests::service_address(
            "WEIR_POSTGRES_URL",
            "postgres.sh",
            &[("WEIR_POSTGRES_DIR", dir.into())],
        )
    })
}

/// A new connection to the test server.
pub fn connect() -> Client {
    Client::connect(url(), NoTls).expect("connect to the test PostgreSQL server")
}

pub use weir_tests::unique;

/// A schema of one test, dropped at the end, with an `accounts`/`ledger` pair for effects.
pub struct Schema {
    pub name: String,
    pub db: Client,
}

impl Schema {
    /// An empty schema.
    pub fn bare(prefix: &str) -> Schema {
        let name = unique(prefix);
        let mut db = connect();
        db.batch_execute(&format!("CREATE SCHEMA {name}"))
            .expect("create the test schema");
        Schema { name, db }
    }

    pub fn new(prefix: &str) -> Schema {
        let name = unique(prefix);
        let mut db = connect();
        db.batch_execute(&format!(
            "CREATE SCHEMA {name};
             CREATE TABLE {name}.accounts (id TEXT PRIMARY KEY, balance BIGINT NOT NULL DEFAULT 0);
             CREATE TABLE {name}.ledger (key TEXT NOT NULL, account TEXT NOT NULL,
                 amount BIGINT NOT NULL CONSTRAINT positive CHECK (amount > 0));"
        ))
        .expect("create the test schema");
        Schema { name, db }
    }

    /// `schema.processed_messages`
    pub fn keys_table(&self) -> String {
        format!("{}.processed_messages", self.name)
    }

    /// The idempotency keys in `schema.processed_messages`, sorted.
    pub fn keys(&mut self) -> Vec<String> {
        let t = self.keys_table();
        self.db
            .query(&format!("SELECT idempotency_key FROM {t} ORDER BY 1"), &[])
            .expect("read the keys")
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// Rows per ledger key.
    pub fn ledger_counts(&mut self) -> std::collections::BTreeMap<String, i64> {
        self.db
            .query(
                &format!(
                    "SELECT key, count(*) FROM {}.ledger GROUP BY key",
                    self.name
                ),
                &[],
            )
            .expect("read the ledger")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }

    /// Balance per account.
    pub fn balances(&mut self) -> std::collections::BTreeMap<String, i64> {
        self.db
            .query(
                &format!("SELECT id, balance FROM {}.accounts", self.name),
                &[],
            )
            .expect("read the balances")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let _ = self
            .db
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name));
    }
}

/// Waits (up to a minute) for a job started with the fail point `POINT=kill` to kill itself
/// there, and checks that it did: SIGKILL, and the fail point's line on standard error.
pub fn expect_fail_point_kill(child: &mut std::process::Child, point: &str) {
    use std::os::unix::process::ExitStatusExt;
    let status = weir_tests::wait_within(child, std::time::Duration::from_secs(60));
    let err = weir_tests::stderr_of(child);
    assert_eq!(
        status.signal(),
        Some(9),
        "expected the fail point's SIGKILL: {err}"
    );
    assert!(
        err.contains(&format!("fail point '{point}': kill")),
        "{err}"
    );
}
