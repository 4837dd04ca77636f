//! The dashboard of `weir serve`, driven in headless Chromium (Debian's package, which
//! `.ci/run` installs) over the DevTools protocol: a tenant signs in with its token, sees its
//! running query's charts drawn from its progress records, stops the query from the page, and
//! the test saves a screenshot beside its other outputs.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use base64::Engine;
use serde_json::{Value, json};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};
use weir_tests::serve::{ACME, SQL, Server, batches, http, pipeline, tenants_file, write_orders};

const EXE: &str = env!("CARGO_BIN_EXE_weir-test-cli");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

/// Chromium: `$WEIR_CHROMIUM`, else `chromium` on the PATH.
fn chromium() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("WEIR_CHROMIUM") {
        return Ok(PathBuf::from(path));
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("chromium"))
            .find(|p| p.is_file())
    });
    found.context(
        "no chromium: the dashboard test needs Debian's chromium package \
         (`bash .ci/run` installs it, see scripts/setup.sh), or WEIR_CHROMIUM set to a Chromium",
    )
}

/// A headless Chromium and a DevTools connection to its page.
struct Browser {
    child: Child,
    ws: WebSocket<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn launch() -> Result<Self> {
        let profile = tempfile::tempdir()?;
        let mut child = Command::new(chromium()?)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--remote-debugging-port=0",
                "--remote-debugging-address=127.0.0.1",
                "--window-size=1280,900",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting chromium")?;
        let stderr = child.stderr.take().context("stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        let endpoint = loop {
            let line = lines
                .next()
                .context("chromium ended before it listened")??;
            if let Some(url) = line.split("DevTools listening on ws://").nth(1) {
                break url.split('/').next().unwrap_or_default().to_owned();
            }
        };
        // The rest of its chatter, drained so that it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        let list = http(&endpoint, "GET", "/json/list", None, b"")?;
        let targets: Value = serde_json::from_str(&list.body)?;
        let page = targets
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["type"] == "page")
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .with_context(|| format!("no page among {targets}"))?
            .to_owned();
        let (ws, _) = tungstenite::connect(page.as_str())?;
        Ok(Self {
            child,
            ws,
            next_id: 0,
            _profile: profile,
        })
    }

    fn call(&mut self, method: &str, params: Value) -> Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        let request = json!({"id": id, "method": method, "params": params});
        self.ws.send(Message::text(request.to_string()))?;
        loop {
            let Message::Text(text) = self.ws.read()? else {
                continue;
            };
            let message: Value = serde_json::from_str(text.as_str())?;
            if message["id"].as_u64() != Some(id) {
                continue; // an event
            }
            if !message["error"].is_null() {
                bail!("{method}: {}", message["error"]);
            }
            return Ok(message["result"].clone());
        }
    }

    fn eval(&mut self, expression: &str) -> Result<Value> {
        let result = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        )?;
        if !result["exceptionDetails"].is_null() {
            bail!("{expression}: {}", result["exceptionDetails"]);
        }
        Ok(result["result"]["value"].clone())
    }

    fn wait_until(&mut self, what: &str, expression: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.eval(expression)? == Value::Bool(true) {
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "the page never showed {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether the canvas of `chart` for `query` has at least three points and ink on it.
fn drawn(query: &str, chart: &str) -> String {
    format!(
        r#"(() => {{
  const c = document.querySelector('[data-query="{query}"] canvas[data-chart="{chart}"]');
  if (!c || Number(c.dataset.points) < 3) return false;
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let ink = 0;
  for (let i = 3; i < d.length; i += 4) if (d[i] > 0) ink++;
  return ink > 200;
}})()"#
    )
}

#[test]
fn a_tenant_watches_and_stops_its_query_in_the_dashboard() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let home = dir.path().join("home");
    let tenants = tenants_file(dir.path(), "")?;
    write_orders(&home.join("acme/data/orders"), 8)?;
    let server = Server::start(EXE, &cache(), &home, &tenants)?;
    let text = pipeline("orders", SQL, "");
    let (status, reply) = server.json("PUT", "/v1/queries/orders", ACME, text.as_bytes())?;
    ensure!(status == 201, "create: {status} {reply}");
    server.wait_for("orders", ACME, |q| batches(q) >= 4)?;

    let mut browser = Browser::launch()?;
    browser.call(
        "Page.navigate",
        json!({"url": format!("http://{}/", server.addr)}),
    )?;
    browser.wait_until(
        "the sign-in form",
        "document.readyState === 'complete' && !!document.querySelector('#token')",
    )?;
    browser.eval(&format!(
        "document.querySelector('#token').value = '{ACME}'; document.querySelector('#login').click(); true"
    ))?;
    browser.wait_until(
        "the tenant signed in",
        "document.querySelector('#who').textContent === 'tenant acme'",
    )?;
    browser.wait_until(
        "the running query",
        r#"document.querySelector('[data-query="orders"]')?.dataset.status === 'running'"#,
    )?;
    for chart in ["rate", "duration"] {
        browser.wait_until(&format!("the {chart} chart drawn"), &drawn("orders", chart))?;
    }

    browser.eval(r#"document.querySelector('[data-query="orders"] button.stop').click(); true"#)?;
    browser.wait_until(
        "the query stopped",
        r#"document.querySelector('[data-query="orders"]').dataset.status === 'stopped'"#,
    )?;
    let (_, q) = server.json("GET", "/v1/queries/orders", ACME, b"")?;
    ensure!(q["status"] == "stopped", "the API says {}", q["status"]);

    let shot = browser.call("Page.captureScreenshot", json!({"format": "png"}))?;
    let png = base64::engine::general_purpose::STANDARD
        .decode(shot["data"].as_str().context("screenshot data")?)?;
    ensure!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "a screenshot"
    );
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("serve-dashboard.png"), &png)?;
    Ok(())
}
