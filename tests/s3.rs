//! The S3-compatible server of the object-storage tests: S3Proxy started by `scripts/s3.sh`
//! (once per test process, stopped after it) unless `WEIR_S3_ENDPOINT` names a running one
//! (as `.ci/run` does, with `WEIR_S3_DIR` naming its directory), and dedicated servers for
//! tests that kill and restart theirs.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The bucket every test writes into, each under its own prefix.
pub const BUCKET: &str = "weir-tests";

/// A running S3-compatible server.
#[derive(Debug)]
pub struct Server {
    /// Its endpoint, `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// Its directory (`WEIR_S3_DIR` of scripts/s3.sh): the buckets are directories of
    /// `data/`.
    pub dir: PathBuf,
    /// Stop it when dropped (dedicated servers).
    owned: bool,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/s3.sh")
}

fn run(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("bash")
        .arg(script())
        .args(args)
        .env("WEIR_S3_DIR", dir)
        .output()
        .unwrap_or_else(|e| panic!("run scripts/s3.sh: {e}"));
    assert!(
        out.status.success(),
        "scripts/s3.sh {} failed:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The shared server: every test's objects go to bucket [`BUCKET`] under a prefix of its
/// own ([`url`]). This process's object stores are configured for it
/// (`weir_objstore::set_options`), and [`Server::env`] gives child processes the same.
pub fn shared() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let dir = match std::env::var("WEIR_S3_DIR") {
            Ok(d) if !d.trim().is_empty() && std::env::var("WEIR_S3_ENDPOINT").is_ok() => {
                PathBuf::from(d)
            }
            _ => std::env::temp_dir().join(format!("weir-tests-s3-{}", std::process::id())),
        };
        let endpoint = crate::service_address(
            "WEIR_S3_ENDPOINT",
            "s3.sh",
            &[("WEIR_S3_DIR", dir.clone().into_os_string())],
        );
        let server = Server {
            endpoint,
            dir,
            owned: false,
        };
        server.make_bucket(BUCKET);
        weir_objstore::set_options(server.options());
        server
    })
}

/// True for the name of a write the server has in progress: S3Proxy's filesystem provider
/// writes an object to `<name>-<UUID>` beside it and renames it into place, and its
/// listings show that file for the moment it exists (S3 never shows one). A reader that
/// watches objects appear skips these; every other name counts.
pub fn is_server_temporary(name: &str) -> bool {
    let Some((_, tail)) = name.len().checked_sub(36).map(|i| name.split_at(i)) else {
        return false;
    };
    let dashed = [8, 13, 18, 23];
    name.len() > 37
        && name.as_bytes()[name.len() - 37] == b'-'
        && tail.bytes().enumerate().all(|(i, b)| {
            if dashed.contains(&i) {
                b == b'-'
            } else {
                b.is_ascii_hexdigit()
            }
        })
}

/// A fresh `s3://weir-tests/<test>-<unique>` prefix on the shared server.
pub fn url(test: &str) -> String {
    shared();
    format!("s3://{BUCKET}/{}", crate::unique(test))
}

impl Server {
    /// A server of the test's own, in `dir` (which must not be the shared one's), stopped and
    /// removed when dropped: for tests that kill and restart their server.
    pub fn dedicated(dir: &Path) -> Server {
        // A port of its own, below the range the shared server and the kernel's ephemeral
        // ports come from, so two servers starting at once never race for one.
        let port = free_port();
        let out = std::process::Command::new("bash")
            .arg(script())
            .arg("start")
            .env("WEIR_S3_DIR", dir)
            .env("WEIR_S3_PORT", port.to_string())
            .output()
            .unwrap_or_else(|e| panic!("run scripts/s3.sh: {e}"));
        assert!(
            out.status.success(),
            "scripts/s3.sh start failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let endpoint = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or("")
            .trim()
            .to_string();
        assert!(
            endpoint.starts_with("http://"),
            "scripts/s3.sh start printed {endpoint:?}"
        );
        let server = Server {
            endpoint,
            dir: dir.to_path_buf(),
            owned: true,
        };
        server.make_bucket(BUCKET);
        server
    }

    /// Creates `bucket` if it does not exist.
    pub fn make_bucket(&self, bucket: &str) {
        run(&self.dir, &["mb", bucket]);
    }

    /// SIGKILLs the server (its data stays).
    pub fn kill(&self) {
        run(&self.dir, &["kill"]);
    }

    /// Starts it again after [`kill`](Self::kill), on the same port and data.
    pub fn restart(&self) {
        let endpoint = run(&self.dir, &["start"])
            .lines()
            .last()
            .unwrap_or("")
            .trim()
            .to_string();
        assert_eq!(endpoint, self.endpoint, "the server came back elsewhere");
    }

    /// The `object_store` options that reach this server (endpoint, test credentials, plain
    /// HTTP).
    pub fn options(&self) -> Vec<(String, String)> {
        self.env()
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect()
    }

    /// The environment a child process (`file_sum`, `weir`) needs to use this server: the
    /// standard `AWS_*` variables of `scripts/s3.sh env`.
    pub fn env(&self) -> Vec<(String, String)> {
        run(&self.dir, &["env"])
            .lines()
            .filter_map(|l| l.strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| {
                let v = if k == "AWS_ENDPOINT_URL" {
                    self.endpoint.as_str()
                } else {
                    v
                };
                (
                    k.to_string(),
                    v.trim_matches('\'').trim_matches('"').to_string(),
                )
            })
            .collect()
    }

    /// The names (last part) of the objects under `prefix` of `bucket`, as the server stores
    /// them, without the lease records of the runs that owned the prefix (`.weir-owners/`,
    /// which stay, as in a directory).
    pub fn object_names(&self, bucket: &str, prefix: &str) -> Vec<String> {
        self.files(bucket, prefix)
            .iter()
            .filter(|f| !f.parent().is_some_and(|d| d.ends_with(".weir-owners")))
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    }

    /// The objects under `prefix` of `bucket`, as the server's files: the filesystem
    /// provider keeps each object as a file (for checks that must not go through weir).
    pub fn files(&self, bucket: &str, prefix: &str) -> Vec<PathBuf> {
        let root = self.dir.join("data").join(bucket).join(prefix);
        let mut out = Vec::new();
        let mut stack = vec![root];
        while let Some(d) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in entries.flatten() {
                if e.path().is_dir() {
                    stack.push(e.path());
                } else {
                    out.push(e.path());
                }
            }
        }
        out.sort();
        out
    }
}

/// A port nobody listens on, from 20000–32000.
fn free_port() -> u16 {
    let seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
    (0..200u64)
        .map(|i| 20_000 + (seed.wrapping_mul(2_654_435_761).wrapping_add(i * 7919) % 12_000) as u16)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port in 20000-32000")
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::process::Command::new("bash")
                .arg(script())
                .arg("stop")
                .env("WEIR_S3_DIR", &self.dir)
                .output();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn server_temporaries_are_told_from_objects() {
        assert!(super::is_server_temporary(
            "part-0-00000000000000000005-fad25135-83cd-4e82-81e3-50b151cb8f6d"
        ));
        assert!(!super::is_server_temporary("part-0-00000000000000000005"));
        assert!(!super::is_server_temporary(
            "part-0-00000000000000000005.parquet"
        ));
        assert!(!super::is_server_temporary(
            "fad25135-83cd-4e82-81e3-50b151cb8f6d"
        ));
        assert!(!super::is_server_temporary(
            "part-0-1-fad25135x83cd-4e82-81e3-50b151cb8f6d"
        ));
    }
}
