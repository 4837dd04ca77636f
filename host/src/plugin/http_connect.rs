//! Sending a plugin's HTTP request to an address the host checked.
//!
//! A grant names a host, but what a request reaches is an address, and names are the tenant's
//! to choose: a granted `metadata.example` may resolve to 169.254.169.254 (the cloud's
//! credentials service) or 127.0.0.1 (the host's own admin ports). So the host resolves the
//! name once, checks every address it got, and connects to a checked one itself — wasi:http's
//! default sender would resolve the name again, and a DNS server answering differently the
//! second time (rebinding) would get past the check. Loopback, private, link-local and other
//! special addresses are reached only through a grant of the address itself, and only when the
//! operator's policy lets plugins reach such addresses at all.
//!
//! The sending itself follows `wasmtime_wasi_http::default_send_request` (HTTP/1.1 over tokio,
//! rustls with the webpki roots, the request options' timeouts), with the resolved addresses
//! in place of the authority.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::net::TcpStream;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody};

use super::grants::HttpGrant;

/// What kind of special address `ip` is, or `None` for a public one.
pub fn special_address(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            if v4.is_loopback() {
                Some("loopback")
            } else if v4.is_private() {
                Some("private")
            } else if v4.is_link_local() {
                Some("link-local")
            } else if v4.is_unspecified() || a == 0 {
                Some("unspecified")
            } else if a == 100 && (64..128).contains(&b) {
                Some("shared (carrier-grade NAT)")
            } else if v4.is_broadcast() || v4.is_multicast() || a >= 240 {
                Some("broadcast, multicast or reserved")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return special_address(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            if v6.is_loopback() {
                Some("loopback")
            } else if v6.is_unspecified() {
                Some("unspecified")
            } else if first & 0xfe00 == 0xfc00 {
                Some("private (unique local)")
            } else if first & 0xffc0 == 0xfe80 {
                Some("link-local")
            } else if v6.is_multicast() {
                Some("broadcast, multicast or reserved")
            } else {
                None
            }
        }
    }
}

/// Which of the addresses `host:port` resolved to a request may go to, in order; `Err`: why
/// none may. Public addresses are covered by the grant of the name (already checked); a
/// special one only by a grant of that very address, and only when `private_networks`.
pub(crate) fn checked_addresses(
    host: &str,
    port: u16,
    resolved: &[SocketAddr],
    grants: &[HttpGrant],
    private_networks: bool,
) -> Result<Vec<SocketAddr>, String> {
    let mut allowed = Vec::new();
    let mut refusal = None;
    for address in resolved {
        let ip = address.ip();
        let Some(class) = special_address(ip) else {
            allowed.push(*address);
            continue;
        };
        let granted = grants.iter().any(|g| {
            g.host.parse::<IpAddr>().is_ok_and(|granted| granted == ip)
                && g.port.is_none_or(|p| p == port)
        });
        if granted && private_networks {
            allowed.push(*address);
        } else if refusal.is_none() {
            let shown = SocketAddr::new(ip, port);
            refusal = Some(if granted {
                format!(
                    "HTTP to {host}:{port} refused: {ip} is a {class} address, and the operator's policy lets plugins reach public addresses only"
                )
            } else {
                format!(
                    "HTTP to {host}:{port} refused: {host} resolves to {ip}, a {class} address, which only a grant of \"{shown}\" itself may reach"
                )
            });
        }
    }
    if allowed.is_empty() {
        Err(refusal
            .unwrap_or_else(|| format!("HTTP to {host}:{port} failed: {host} has no address")))
    } else {
        Ok(allowed)
    }
}

/// The response and the future that finishes its connection, as wasi:http's hook returns them.
pub(crate) type Sent = (
    http::Response<WasiBody>,
    Box<dyn Future<Output = Result<(), HttpError>> + Send>,
);

/// Where a request goes once its name is resolved and checked.
pub(crate) struct Target {
    /// The name (or address) of the request, for TLS and the refusal message.
    pub host: String,
    pub port: u16,
    pub tls: bool,
}

/// Resolves `target`, checks the addresses against `grants`, and sends `request` to the first
/// checked address that accepts a connection.
///
/// # Errors
/// `Err(Ok(reason))`: refused by the check (the call fails with it); `Err(Err(e))`: the
/// request failed as any request can (connect, TLS, protocol, timeouts).
pub(crate) async fn send(
    mut request: http::Request<WasiBody>,
    options: RequestOptions,
    target: Target,
    grants: Vec<HttpGrant>,
    private_networks: bool,
) -> Result<Sent, Result<String, HttpError>> {
    let connect_timeout = options.connect_timeout.unwrap_or(Duration::from_secs(600));
    let first_byte_timeout = options
        .first_byte_timeout
        .unwrap_or(Duration::from_secs(600));
    let between_bytes_timeout = options
        .between_bytes_timeout
        .unwrap_or(Duration::from_secs(600))
        .max(Duration::from_nanos(1));
    let Target { host, port, tls } = target;
    let resolved: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => {
            match tokio::time::timeout(connect_timeout, tokio::net::lookup_host((&*host, port)))
                .await
            {
                Ok(Ok(found)) => found.collect(),
                Ok(Err(_)) => {
                    return Err(Err(HttpError::DnsError {
                        rcode: None,
                        info_code: None,
                    }));
                }
                Err(_) => return Err(Err(HttpError::DnsTimeout)),
            }
        }
    };
    let addresses =
        checked_addresses(&host, port, &resolved, &grants, private_networks).map_err(Ok)?;
    let mut stream = None;
    let mut last = None;
    for address in addresses {
        match tokio::time::timeout(connect_timeout, TcpStream::connect(address)).await {
            Ok(Ok(s)) => {
                stream = Some(s);
                break;
            }
            Ok(Err(e)) => last = Some(HttpError::Connect(e)),
            Err(_) => last = Some(HttpError::ConnectionTimeout),
        }
    }
    let Some(stream) = stream else {
        return Err(Err(last.unwrap_or(HttpError::ConnectionRefused)));
    };
    let io: Box<dyn Stream> = if tls {
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.into(),
        };
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
        let name = match host.parse::<IpAddr>() {
            Ok(ip) => rustls::pki_types::ServerName::from(ip),
            Err(_) => rustls::pki_types::ServerName::try_from(host.clone())
                .map_err(|_| Err(HttpError::HttpRequestUriInvalid))?,
        };
        Box::new(
            connector
                .connect(name, stream)
                .await
                .map_err(|e| Err(HttpError::Tls(e)))?,
        )
    } else {
        Box::new(stream)
    };
    let (mut sender, conn) = tokio::time::timeout(
        connect_timeout,
        hyper::client::conn::http1::Builder::new().handshake::<_, WasiBody>(TokioIo::new(io)),
    )
    .await
    .map_err(|_| Err(HttpError::ConnectionTimeout))?
    .map_err(|e| Err(HttpError::from(e)))?;
    // The request line carries only the path: scheme and authority go to proxies.
    let path = request
        .uri()
        .path_and_query()
        .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
    *request.uri_mut() = http::Uri::builder()
        .path_and_query(path)
        .build()
        .map_err(|_| Err(HttpError::HttpRequestUriInvalid))?;

    let mut conn = Some(Box::pin(conn));
    let mut response = Box::pin(tokio::time::timeout(
        first_byte_timeout,
        sender.send_request(request),
    ));
    // Wait for the response while driving the connection's I/O.
    let response = std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = response.as_mut().poll(cx) {
            return Poll::Ready(r.map_err(|_| HttpError::ConnectionReadTimeout));
        }
        if let Some(c) = conn.as_mut()
            && let Poll::Ready(done) = c.as_mut().poll(cx)
        {
            conn = None;
            if let Err(e) = done {
                return Poll::Ready(Ok(Err(e)));
            }
            return response
                .as_mut()
                .poll(cx)
                .map(|r| r.map_err(|_| HttpError::ConnectionReadTimeout));
        }
        Poll::Pending
    })
    .await
    .map_err(Err)?
    .map_err(|e| Err(HttpError::from(e)))?;
    let mut interval = tokio::time::interval(between_bytes_timeout);
    interval.reset();
    let response = response.map(|incoming| {
        Incoming {
            incoming,
            timeout: interval,
        }
        .boxed_unsync()
    });
    let finish = async move {
        let Some(conn) = conn else { return Ok(()) };
        conn.await.map_err(|e| {
            if e.is_timeout() {
                HttpError::HttpResponseTimeout
            } else {
                HttpError::from(e)
            }
        })
    };
    Ok((response, Box::new(finish)))
}

trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Sync + Unpin + 'static {}
impl<T> Stream for T where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Sync + Unpin + 'static
{
}

/// The response body, with the request options' time limit between chunks.
struct Incoming {
    incoming: hyper::body::Incoming,
    timeout: tokio::time::Interval,
}

impl http_body::Body for Incoming {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, HttpError>>> {
        match Pin::new(&mut self.incoming).poll_frame(cx) {
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(if e.is_timeout() {
                HttpError::HttpResponseTimeout
            } else {
                HttpError::from(e)
            }))),
            Poll::Ready(Some(Ok(frame))) => {
                self.timeout.reset();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                ready!(self.timeout.poll_tick(cx));
                Poll::Ready(Some(Err(HttpError::ConnectionReadTimeout)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.incoming.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(text: &str) -> HttpGrant {
        HttpGrant::parse(text).unwrap()
    }

    fn at(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn special_addresses_are_told_apart_from_public_ones() {
        for (ip, class) in [
            ("127.0.0.1", "loopback"),
            ("127.8.9.10", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "link-local"),
            ("0.0.0.0", "unspecified"),
            ("100.64.0.1", "shared (carrier-grade NAT)"),
            ("255.255.255.255", "broadcast, multicast or reserved"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("fd00::1", "private (unique local)"),
            ("fe80::1", "link-local"),
            ("::ffff:169.254.169.254", "link-local"),
            ("::ffff:127.0.0.1", "loopback"),
        ] {
            assert_eq!(special_address(ip.parse().unwrap()), Some(class), "{ip}");
        }
        for ip in ["93.184.216.34", "8.8.8.8", "172.32.0.1", "2606:4700::1111"] {
            assert_eq!(special_address(ip.parse().unwrap()), None, "{ip}");
        }
    }

    #[test]
    fn a_granted_name_reaches_public_addresses_only() {
        let grants = [grant("metadata.example")];
        let why = checked_addresses(
            "metadata.example",
            80,
            &[at("169.254.169.254:80")],
            &grants,
            true,
        )
        .unwrap_err();
        assert_eq!(
            why,
            "HTTP to metadata.example:80 refused: metadata.example resolves to 169.254.169.254, a link-local address, which only a grant of \"169.254.169.254:80\" itself may reach"
        );
        let why = checked_addresses(
            "localhost",
            8080,
            &[at("127.0.0.1:8080")],
            &[grant("localhost")],
            true,
        )
        .unwrap_err();
        assert!(
            why.contains("localhost resolves to 127.0.0.1, a loopback address"),
            "{why}"
        );
        // A rebinding answer mixing both: only the public address is used.
        let mixed = [at("127.0.0.1:80"), at("93.184.216.34:80")];
        assert_eq!(
            checked_addresses("x.example", 80, &mixed, &[grant("x.example")], true),
            Ok(vec![at("93.184.216.34:80")])
        );
    }

    #[test]
    fn a_special_address_is_reached_by_its_own_grant_when_the_policy_allows() {
        let grants = [grant("127.0.0.1:8080")];
        let to = [at("127.0.0.1:8080")];
        assert_eq!(
            checked_addresses("127.0.0.1", 8080, &to, &grants, true),
            Ok(to.to_vec())
        );
        let why = checked_addresses("127.0.0.1", 8080, &to, &grants, false).unwrap_err();
        assert!(
            why.contains("127.0.0.1 is a loopback address, and the operator's policy lets plugins reach public addresses only"),
            "{why}"
        );
        // The grant of another port does not cover it.
        let other = [grant("127.0.0.1:9090")];
        assert!(checked_addresses("127.0.0.1", 8080, &to, &other, true).is_err());
        // IPv6 written differently is the same address.
        let v6 = [grant("[0:0::1]:99")];
        assert!(checked_addresses("::1", 99, &[at("[::1]:99")], &v6, true).is_ok());
    }
}
