//! A headless Chromium driven over the DevTools protocol, for the dashboard's tests
//! (`tests/end_to_end/dashboard.rs`).
//!
//! Chromium is started with `--remote-debugging-pipe`: it reads protocol messages (JSON,
//! each ended by a NUL byte) on its file descriptor 3 and writes answers and events on 4.
//! A `bash` wrapper maps them onto the child's standard input and output, so no crate
//! beyond serde_json is needed. Every wait polls the page with a deadline.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// The width and height of the page in the tests and screenshots: a laptop screen.
pub const VIEWPORT: (u32, u32) = (1366, 900);

/// How long one protocol command may take.
const COMMAND_DEADLINE: Duration = Duration::from_secs(30);

/// The Chromium binary: `WEIR_CHROMIUM` if set, else `chromium` or `chromium-browser` on
/// the `PATH`.
///
/// # Panics
/// When there is none, with the command that installs it: the tests never skip.
pub fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("WEIR_CHROMIUM").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser"] {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "Chromium is not installed, and the dashboard's tests load the page in a real headless \
         browser: run `bash scripts/setup.sh` (it installs Debian's chromium package; CI runs \
         it), or set WEIR_CHROMIUM to a Chromium or Chrome binary"
    );
}

/// Where tests leave files for people to look at: `test-artifacts/` in the target
/// directory (`CARGO_TARGET_DIR`, or the one holding the running test binary).
pub fn artifacts_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            // target/debug/deps/end_to_end-HASH
            let exe = std::env::current_exe().ok()?;
            Some(exe.parent()?.parent()?.parent()?.to_path_buf())
        })
        .unwrap_or_else(|| PathBuf::from("target"));
    let dir = target.join("test-artifacts");
    std::fs::create_dir_all(&dir).expect("create the test-artifacts directory");
    dir
}

/// One headless browser with one page.
pub struct Browser {
    child: Child,
    input: ChildStdin,
    messages: Receiver<Value>,
    next_id: u64,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts Chromium and opens `url` in a page of [`VIEWPORT`] size.
    ///
    /// # Panics
    /// When Chromium is missing ([`chromium`]) or does not start.
    pub fn open(url: &str) -> Browser {
        let binary = chromium();
        let profile = tempfile::tempdir().expect("a profile directory");
        let mut child = Command::new("bash")
            .arg("-c")
            .arg(r#"exec "$@" 3<&0 4>&1 0</dev/null 1>&2"#)
            .arg("--")
            .arg(&binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--hide-scrollbars",
                "--remote-debugging-pipe",
            ])
            .arg(format!("--window-size={},{}", VIEWPORT.0, VIEWPORT.1))
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        let input = child.stdin.take().expect("stdin");
        let output = child.stdout.take().expect("stdout");
        let (tx, messages) = channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(output);
            let mut buf = Vec::new();
            while matches!(r.read_until(0, &mut buf), Ok(n) if n > 0) {
                buf.pop_if(|b| *b == 0);
                if let Ok(v) = serde_json::from_slice::<Value>(&buf)
                    && tx.send(v).is_err()
                {
                    return;
                }
                buf.clear();
            }
        });
        let mut b = Browser {
            child,
            input,
            messages,
            next_id: 0,
            session: String::new(),
            _profile: profile,
        };
        let target = b.call("Target.createTarget", json!({ "url": "about:blank" }));
        let target = target["targetId"]
            .as_str()
            .expect("a target id")
            .to_string();
        let attached = b.call(
            "Target.attachToTarget",
            json!({ "targetId": target, "flatten": true }),
        );
        b.session = attached["sessionId"]
            .as_str()
            .expect("a session id")
            .to_string();
        b.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": VIEWPORT.0, "height": VIEWPORT.1, "deviceScaleFactor": 1, "mobile": false }),
        );
        b.call("Page.navigate", json!({ "url": url }));
        b
    }

    /// Sends a command (to the page once attached) and returns its result.
    ///
    /// # Panics
    /// When Chromium answers an error, exits, or does not answer within 30 s.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if !self.session.is_empty() {
            msg["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&msg).expect("serializable");
        bytes.push(0);
        self.input
            .write_all(&bytes)
            .and_then(|_| self.input.flush())
            .unwrap_or_else(|e| panic!("send {method} to Chromium: {e}"));
        let deadline = Instant::now() + COMMAND_DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.messages.recv_timeout(left) {
                Ok(v) if v["id"] == id => {
                    assert!(v["error"].is_null(), "{method} failed: {}", v["error"]);
                    return v["result"].clone();
                }
                Ok(_) => {} // an event, or an answer to someone else
                Err(RecvTimeoutError::Timeout) => {
                    panic!("Chromium did not answer {method} within {COMMAND_DEADLINE:?}")
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("Chromium exited while answering {method}")
                }
            }
        }
    }

    /// Evaluates `expression` in the page and returns its value (JSON-serializable).
    ///
    /// # Panics
    /// When it throws.
    pub fn eval(&mut self, expression: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true }),
        );
        assert!(
            r["exceptionDetails"].is_null(),
            "{expression} threw: {:#}",
            r["exceptionDetails"]
        );
        r["result"]["value"].clone()
    }

    /// Polls `condition` (a JavaScript expression) every 50 ms until it is `true`.
    ///
    /// # Panics
    /// After `limit`, with the page's text, to show what it showed instead.
    pub fn wait_for(&mut self, what: &str, condition: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        let check = format!(
            "(() => {{ try {{ return !!({condition}); }} catch (e) {{ return false; }} }})()"
        );
        while self.eval(&check) != Value::Bool(true) {
            if Instant::now() > deadline {
                let text = self.eval("document.body ? document.body.innerText : '(no body)'");
                panic!(
                    "timed out after {limit:?} waiting for {what} ({condition}); the page shows:\n{}",
                    text.as_str().unwrap_or("")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Clicks the middle of the first element `selector` matches, with the mouse (scrolled
    /// into view first), as a person would.
    ///
    /// # Panics
    /// When nothing matches.
    pub fn click(&mut self, selector: &str) {
        let selector = serde_json::to_string(selector).expect("a string");
        let at = self.eval(&format!(
            "(() => {{ const e = document.querySelector({selector}); if (!e) return null; \
               e.scrollIntoView({{ block: 'center', inline: 'center' }}); \
               const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()"
        ));
        let (x, y) = (
            at[0]
                .as_f64()
                .unwrap_or_else(|| panic!("nothing matches {selector} to click")),
            at[1].as_f64().unwrap_or_default(),
        );
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({ "type": kind, "x": x, "y": y, "button": "left", "clickCount": 1 }),
            );
        }
    }

    /// Saves a PNG of the page's viewport to `path`.
    pub fn screenshot(&mut self, path: &Path) {
        let r = self.call("Page.captureScreenshot", json!({ "format": "png" }));
        let png = base64_decode(r["data"].as_str().expect("screenshot data"));
        std::fs::write(path, png).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.session.clear();
        self.next_id += 1;
        let close = format!(r#"{{"id":{},"method":"Browser.close"}}"#, self.next_id);
        let _ = self.input.write_all(close.as_bytes());
        let _ = self.input.write_all(&[0]);
        let _ = self.input.flush();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Standard base64 (with padding), as the protocol sends screenshots.
fn base64_decode(s: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a') as u32 + 26,
            b'0'..=b'9' => (c - b'0') as u32 + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let clean: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    let mut out = Vec::with_capacity(clean.len() / 4 * 3);
    for chunk in clean.chunks(4) {
        let data: Vec<u8> = chunk.iter().copied().filter(|&c| c != b'=').collect();
        let mut n = 0u32;
        for (i, &c) in data.iter().enumerate() {
            n |= value(c) << (18 - 6 * i);
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..data.len().saturating_sub(1)]);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_decodes_padded_and_unpadded_ends() {
        assert_eq!(super::base64_decode("aGVsbG8="), b"hello");
        assert_eq!(super::base64_decode("aGk="), b"hi");
        assert_eq!(super::base64_decode("aGV5"), b"hey");
        assert_eq!(super::base64_decode("aA=="), b"h");
    }
}
