//! The API server's names, never to be published: the kubeconfig's server host
//! when it is a name, the DNS names of the API server's serving certificate, and
//! `--api-server-names`. In a pod the server is the `kubernetes` ClusterIP, so the
//! URL names nothing; the certificate does: kubeadm puts the
//! `controlPlaneEndpoint`, the control-plane nodes' names and every `certSANs`
//! entry there, and a managed control plane its public endpoint name. An Ingress
//! under a listed domain claiming one of them would send every node's API calls
//! to the name relay.
//!
//! The certificate is read without verifying it: its names only ever add
//! refusals, so a forged one can refuse names, never publish one. It is read in
//! the background and retried until it is ([`read_cert_names`]); until then no
//! name is published at all, so an API server that is down when the agent starts
//! never lets an Ingress publish its name.

use std::{
    io,
    net::{IpAddr, SocketAddr, TcpStream},
    sync::Arc,
    time::Duration,
};

use kube::Config;
use rustls::pki_types::ServerName;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::names::scope::{NameScope, ScopeRule};

/// How long reading the certificate may take before startup goes on without it.
pub(crate) const CERT_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors reading the API server's certificate names.
#[derive(Debug, thiserror::Error)]
pub enum ApiNamesError {
    /// The cluster URL has no host.
    #[error("the cluster URL {url} has no host")]
    NoHost {
        /// The URL.
        url: String,
    },
    /// The host could not be resolved or connected to.
    #[error("failed to connect to the API server at {url}: {source}")]
    Connect {
        /// The URL.
        url: String,
        /// The error.
        source: io::Error,
    },
    /// The TLS handshake failed.
    #[error("failed the TLS handshake with the API server at {url}: {why}")]
    Tls {
        /// The URL.
        url: String,
        /// What failed.
        why: String,
    },
    /// No certificate, or one that is not X.509.
    #[error("the API server at {url} presented no readable certificate: {why}")]
    Certificate {
        /// The URL.
        url: String,
        /// What was wrong.
        why: String,
    },
}

/// The DNS names of the serving certificate of the API server at `config`'s URL,
/// read within `timeout`.
pub async fn cert_names(config: &Config, timeout: Duration) -> Result<Vec<String>, ApiNamesError> {
    let url = config.cluster_url.to_string();
    let host = config
        .cluster_url
        .host()
        .ok_or_else(|| ApiNamesError::NoHost { url: url.clone() })?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = config.cluster_url.port_u16().unwrap_or(443);
    let connect = |source| ApiNamesError::Connect {
        url: url.clone(),
        source,
    };
    let addr: SocketAddr = match host.parse::<IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port),
        Err(_) => tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(connect)?
            .next()
            .ok_or_else(|| connect(io::ErrorKind::NotFound.into()))?,
    };
    let task = tokio::task::spawn_blocking(move || handshake(addr, &host, timeout, &url));
    match tokio::time::timeout(timeout, task).await {
        Ok(Ok(result)) => result,
        Ok(Err(e)) => Err(ApiNamesError::Tls {
            url: config.cluster_url.to_string(),
            why: format!("the reading task failed: {e}"),
        }),
        Err(_) => Err(ApiNamesError::Tls {
            url: config.cluster_url.to_string(),
            why: format!("no certificate within {timeout:?}"),
        }),
    }
}

fn handshake(
    addr: SocketAddr,
    host: &str,
    timeout: Duration,
    url: &str,
) -> Result<Vec<String>, ApiNamesError> {
    let tls = |why: String| ApiNamesError::Tls {
        url: url.to_owned(),
        why,
    };
    let mut stream =
        TcpStream::connect_timeout(&addr, timeout).map_err(|source| ApiNamesError::Connect {
            url: url.to_owned(),
            source,
        })?;
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    // Any certificate: its names only add refusals.
    let config = crate::tls::accept_any_certificate().map_err(|e| tls(e.to_string()))?;
    let name = ServerName::try_from(host.to_owned()).map_err(|e| tls(e.to_string()))?;
    let mut conn =
        rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| tls(e.to_string()))?;
    while conn.is_handshaking() {
        conn.complete_io(&mut stream)
            .map_err(|e| tls(e.to_string()))?;
    }
    let cert = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or_else(|| ApiNamesError::Certificate {
            url: url.to_owned(),
            why: "no certificate".into(),
        })?;
    let ee = webpki::EndEntityCert::try_from(cert).map_err(|e| ApiNamesError::Certificate {
        url: url.to_owned(),
        why: e.to_string(),
    })?;
    Ok(ee.valid_dns_names().map(str::to_owned).collect())
}

/// `scope` refusing the API server's names known without asking it: the
/// kubeconfig's server host and `listed` (`--api-server-names`). The certificate's
/// names come later, from [`read_cert_names`], and are applied per decision round
/// ([`apply`]).
pub fn refuse(scope: NameScope, config: &Config, listed: &[String]) -> NameScope {
    let mut scope = scope;
    if let Some(host) = super::client::api_server_name(config) {
        scope = scope.refuse_own(&host, ScopeRule::ApiServer, "the API server's host");
    }
    for name in listed {
        scope = scope.refuse_own(
            name,
            ScopeRule::ApiServer,
            "an API server name (--api-server-names)",
        );
    }
    scope
}

/// What is known of the API server's certificate names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertNames {
    /// Not read yet: no hostname is published meanwhile (an Ingress claiming the
    /// API server's name must never win the race against an API outage at start).
    Pending {
        /// Why the last attempt failed, for `status`, the log and the skips.
        last_error: String,
    },
    /// Read (empty for a server without TLS, whose certificate names nothing).
    Known(Vec<String>),
}

/// The receiving end of [`read_cert_names`].
pub(crate) type CertNamesRx = watch::Receiver<CertNames>;

/// A [`CertNamesRx`] that already knows `names` (tests; sources that read none).
pub fn known(names: Vec<String>) -> CertNamesRx {
    watch::channel(CertNames::Known(names)).1
}

/// The first retry of a failed certificate read, doubled up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between two certificate reads.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Reads the API server's certificate names in the background, retrying with
/// backoff (1 s doubling to 30 s) until it has them: an API server that is down
/// when the agent starts is read once it answers, not never.
pub fn read_cert_names(config: Config) -> CertNamesRx {
    let scheme_is_tls = config.cluster_url.scheme_str() == Some("https");
    let (tx, rx) = watch::channel(CertNames::Pending {
        last_error: "not read yet".into(),
    });
    if !scheme_is_tls {
        info!(url = %config.cluster_url, "the API server URL is not https: it has no certificate names to refuse");
        let _ = tx.send(CertNames::Known(Vec::new()));
        return rx;
    }
    tokio::spawn(async move {
        let mut wait = RETRY_FIRST;
        loop {
            match cert_names(&config, CERT_TIMEOUT).await {
                Ok(names) => {
                    info!(names = ?names, "the API server's certificate names are never published");
                    let _ = tx.send(CertNames::Known(names));
                    return;
                }
                Err(e) => {
                    warn!(error = %e, retry_in = ?wait,
                        "the API server's certificate names cannot be read yet: no hostname \
                         is published until they are");
                    let sent = tx.send(CertNames::Pending {
                        last_error: e.to_string(),
                    });
                    if sent.is_err() {
                        // Every source is gone: nothing to read them for.
                        return;
                    }
                }
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(RETRY_MAX);
        }
    });
    rx
}

/// `scope` as one decision round uses it: refusing the certificate's names when
/// known, withholding every name while they are not.
pub fn apply(scope: &NameScope, cert: &CertNames) -> NameScope {
    match cert {
        CertNames::Known(names) => names.iter().fold(scope.clone(), |s, name| {
            s.refuse_own(
                name,
                ScopeRule::ApiServer,
                "a name of the API server's certificate",
            )
        }),
        CertNames::Pending { last_error } => scope.clone().withhold_all(format!(
            "the API server's certificate names are not known yet ({last_error}), and a \
             name could be one of them"
        )),
    }
}
