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
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, ClientError> {
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
    Client::try_from(config).map_err(ClientError::Build)
}
