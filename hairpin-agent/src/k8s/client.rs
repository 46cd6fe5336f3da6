//! Building the kube client: in-cluster (service account) or from a kubeconfig.

use std::path::{Path, PathBuf};

use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

/// Errors building the client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file could not be read or parsed.
    #[error("failed to read kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// kube's error.
        source: kube::config::KubeconfigError,
    },
    /// Neither in-cluster configuration nor a kubeconfig was found.
    #[error(
        "no Kubernetes configuration: run in a pod with a service account, set KUBECONFIG, \
         or pass --kubeconfig (or --frontends FILE to run without an API server): {0}"
    )]
    Infer(#[source] kube::config::InferConfigError),
    /// The client could not be built from the configuration.
    #[error("failed to build the Kubernetes client: {0}")]
    Build(#[source] kube::Error),
}

/// A client from `kubeconfig` when given, else inferred (in-cluster, then
/// `$KUBECONFIG` / `~/.kube/config`).
pub(crate) async fn client(kubeconfig: Option<&Path>) -> Result<Client, ClientError> {
    from_config(config(kubeconfig).await?)
}

/// A client from a configuration read by [`config`].
pub(crate) fn from_config(config: Config) -> Result<Client, ClientError> {
    Client::try_from(config).map_err(ClientError::Build)
}

/// The API server's host when it is a name (not an IP address), from the
/// configuration's cluster URL: a name that must never be published.
pub(crate) fn api_server_name(config: &Config) -> Option<String> {
    let host = config.cluster_url.host()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.parse::<std::net::IpAddr>()
        .is_err()
        .then(|| host.to_owned())
}

/// The configuration from `kubeconfig` when given, else inferred (in-cluster, then
/// `$KUBECONFIG` / `~/.kube/config`).
pub(crate) async fn config(kubeconfig: Option<&Path>) -> Result<Config, ClientError> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|source| ClientError::Kubeconfig {
                path: path.to_path_buf(),
                source,
            })?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|source| ClientError::Kubeconfig {
                    path: path.to_path_buf(),
                    source,
                })?
        }
        None => Config::infer().await.map_err(ClientError::Infer)?,
    };
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_server_is_named_only_when_its_host_is_a_name() {
        let at = |url: &str| api_server_name(&Config::new(url.parse().expect("url")));
        assert_eq!(
            at("https://api.k8s.example.com:6443"),
            Some("api.k8s.example.com".into())
        );
        assert_eq!(at("https://10.96.0.1:443"), None);
        assert_eq!(at("https://[2001:db8::1]:6443"), None);
    }
}
