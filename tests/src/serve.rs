//! `weir serve` for the tests: a server run as a child process on a free port, a tenant's HTTP
//! client (one request per connection, no client library), and the pipelines the tests host.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::SCHEMA;

pub const ACME: &str = "acme-token-1";
pub const ZETA: &str = "zeta-token-2";
pub const OPERATOR: &str = "operator-token-3";

pub fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// An example plugin's component, by name.
pub fn plugin(name: &str) -> &'static [u8] {
    weir_host::examples::PLUGINS
        .iter()
        .find(|(n, _)| *n == format!("{name}.wasm"))
        .map(|(_, b)| *b)
        .expect("an example plugin")
}

/// A running `weir serve`; killed with SIGKILL when dropped.
#[derive(Debug)]
pub struct Server {
    child: Child,
    pub addr: String,
}

impl Server {
    /// Starts `exe serve` on `home` with `tenants`, plugins compiled into `cache`.
    pub fn start(exe: &str, cache: &Path, home: &Path, tenants: &Path) -> Result<Self> {
        let mut child = Command::new(exe)
            .args(["serve", "--listen", "127.0.0.1:0", "--max-upload", "4 MiB"])
            .arg("--home")
            .arg(home)
            .arg("--tenants")
            .arg(tenants)
            .arg("--cache-dir")
            .arg(cache)
            .env_remove("WEIR_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting weir serve")?;
        let stdout = child.stdout.take().context("stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let addr = line
            .trim()
            .strip_prefix("weir serve: listening on http://")
            .with_context(|| format!("weir serve said {line:?}"))?
            .to_owned();
        Ok(Self { child, addr })
    }

    pub fn kill(mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    pub fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: &[u8],
    ) -> Result<Reply> {
        http(&self.addr, method, path, token, body)
    }

    pub fn json(&self, method: &str, path: &str, token: &str, body: &[u8]) -> Result<(u16, Value)> {
        let reply = self.call(method, path, Some(token), body)?;
        let json = serde_json::from_str(&reply.body)
            .with_context(|| format!("{method} {path}: not JSON: {}", reply.body))?;
        Ok((reply.status, json))
    }

    /// Polls query `name` until `done` holds of its status (failed or not), for up to a minute.
    pub fn wait_for_status(
        &self,
        name: &str,
        token: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (status, q) = self.json("GET", &format!("/v1/queries/{name}"), token, b"")?;
            ensure!(status == 200, "GET query {name}: {status} {q}");
            if done(&q) {
                return Ok(q);
            }
            ensure!(
                Instant::now() < deadline,
                "query {name} never got there: {q}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls query `name` until `done` holds of its status, for up to a minute; a failed query
    /// is an error.
    pub fn wait_for(
        &self,
        name: &str,
        token: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let q = self.wait_for_status(name, token, |q| q["status"] == "failed" || done(q))?;
        ensure!(
            q["status"] != "failed" || done(&q),
            "query {name} failed: {}",
            q["error"]
        );
        Ok(q)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

/// One HTTP/1.1 request on its own connection.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> Result<Reply> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    // The server may answer (413) before reading all of a large body.
    let _ = stream.write_all(body);
    // Headers, then the body: as long as Content-Length says, else to the end (some servers
    // keep the connection open whatever the request says).
    let mut reader = BufReader::new(stream);
    let mut headers = String::new();
    loop {
        let mut line = String::new();
        ensure!(
            reader.read_line(&mut line)? > 0,
            "the connection closed in the headers"
        );
        if line == "\r\n" {
            break;
        }
        headers.push_str(&line);
    }
    let length = headers.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())
            .flatten()
    });
    let mut raw = Vec::new();
    match length {
        Some(n) => {
            raw.resize(n, 0);
            reader.read_exact(&mut raw)?;
        }
        None => {
            reader.read_to_end(&mut raw)?;
        }
    }
    let body = String::from_utf8_lossy(&raw).into_owned();
    let status = headers
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no status")?;
    Ok(Reply {
        status,
        headers,
        body,
    })
}

pub fn tenants_file(dir: &Path, acme_extra: &str) -> Result<PathBuf> {
    let path = dir.join("tenants.toml");
    std::fs::write(
        &path,
        format!(
            "[[tenant]]\nname = \"acme\"\ntoken_sha256 = \"{}\"\n{acme_extra}\n\n\
             [[tenant]]\nname = \"zeta\"\ntoken_sha256 = \"{}\"\n\n\
             [operator]\ntoken_sha256 = \"{}\"\n",
            sha(ACME.as_bytes()),
            sha(ZETA.as_bytes()),
            sha(OPERATOR.as_bytes())
        ),
    )?;
    Ok(path)
}

pub fn write_orders(dir: &Path, files: usize) -> Result<()> {
    weir_host::examples::write_orders(
        dir,
        weir_host::examples::OrdersSpec {
            files,
            lines_per_file: 300,
            seed: 11,
            malformed_every: 50,
        },
    )?;
    Ok(())
}

/// Orders, one file per batch, through the uploaded `filter_rows` (unless `transform` says
/// otherwise), into JSON files.
pub fn pipeline(name: &str, transform: &str, extra: &str) -> String {
    format!(
        r#"[query]
name = "{name}"
checkpoint = "checkpoints/{name}"
trigger = "50 milliseconds"

[[source]]
name = "orders"
kind = "files"
path = "data/orders"
format = "json"
schema = "{SCHEMA}"
max_files_per_trigger = 1
on_malformed = "drop"

{transform}

[sink]
kind = "files"
path = "out/{name}"
format = "json"
{extra}"#
    )
}

pub const FILTER: &str = r#"[[transform]]
name = "keep_completed"
plugin = "filter_rows"
config = { column = "status", op = "eq", value = "completed" }"#;

pub const SQL: &str = r#"[[transform]]
name = "keep_completed"
sql = "SELECT * FROM input WHERE status = 'completed'""#;

pub fn batches(q: &Value) -> u64 {
    q["progress"]["batchId"].as_u64().map_or(0, |b| b + 1)
}

pub fn problem_keys(reply: &Value) -> Vec<String> {
    reply["problems"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| p["key"].as_str().unwrap_or_default().to_owned())
        .collect()
}
