//! Real kube-proxy on the simulated node, in iptables or nftables mode (IPVS: this
//! kernel has no IPVS), fed by the real API server. It runs in the node namespace
//! (`nsenter --net`: `ip netns exec` would remount /sys) with a configuration that
//! keeps it off the host's global conntrack sysctls.

use std::{fs, time::Duration};

use super::{Cluster, NODE_NAME, POD_CIDRS, Proc};
use crate::{node::KubeProxyMode, sh::output_in};

/// A running kube-proxy; killed on drop.
pub struct KubeProxy {
    proc: Proc,
    /// Its mode.
    pub mode: KubeProxyMode,
}

impl KubeProxy {
    /// Starts kube-proxy in `mode` for the cluster's node and waits until it has
    /// synced its rules once (its healthz answers).
    pub fn start(cluster: &Cluster, mode: KubeProxyMode) -> KubeProxy {
        let mode_name = match mode {
            KubeProxyMode::Iptables => "iptables",
            KubeProxyMode::Nftables => "nftables",
        };
        let config = cluster.dir.join(format!("kube-proxy-{mode_name}.yaml"));
        let kubeconfig = cluster.dir.join("proxy.kubeconfig");
        fs::write(
            &config,
            format!(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n\
                 kind: KubeProxyConfiguration\n\
                 clientConnection:\n  kubeconfig: {kc}\n\
                 hostnameOverride: {NODE_NAME}\n\
                 mode: {mode_name}\n\
                 clusterCIDR: {cidrs}\n\
                 healthzBindAddress: 127.0.0.1:10256\n\
                 metricsBindAddress: 127.0.0.1:10249\n\
                 # This sandbox may not lower a process's OOM score (no CAP_SYS_RESOURCE).\n\
                 oomScoreAdj: 0\n\
                 # The host's conntrack table is shared by every test and helper on the\n\
                 # machine: kube-proxy must not resize it or change its timeouts.\n\
                 conntrack:\n  maxPerCore: 0\n  min: 0\n  tcpEstablishedTimeout: 0s\n  tcpCloseWaitTimeout: 0s\n",
                kc = kubeconfig.display(),
                cidrs = POD_CIDRS.join(","),
            ),
        )
        .expect("kube-proxy config");
        let name = match mode {
            KubeProxyMode::Iptables => "kube-proxy-iptables",
            KubeProxyMode::Nftables => "kube-proxy-nftables",
        };
        let mut proc = Proc::spawn(
            name,
            &cluster.netns,
            &cluster.dir,
            &[
                cluster.bins.proxy.to_str().expect("utf-8 path"),
                &format!("--config={}", config.display()),
                "--v=2",
            ],
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            proc.assert_running();
            let out = output_in(
                &cluster.netns,
                None,
                &[
                    "curl",
                    "-sf",
                    "--max-time",
                    "2",
                    "http://127.0.0.1:10256/healthz",
                ],
            );
            if out.status.success() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "kube-proxy ({mode_name}) not healthy within 30 s:\n{}",
                super::tail(&proc.log_text())
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        KubeProxy { proc, mode }
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        self.proc.log_text()
    }

    /// Whether its rules in the node namespace mention `ip` (an LB IP it programs).
    pub fn programs(&self, netns: &str, ip: &str) -> bool {
        let argv: Vec<&str> = match self.mode {
            KubeProxyMode::Iptables if ip.contains(':') => vec!["ip6tables-save", "-t", "nat"],
            KubeProxyMode::Iptables => vec!["iptables-save", "-t", "nat"],
            KubeProxyMode::Nftables => vec!["nft", "list", "ruleset"],
        };
        let out = output_in(netns, None, &argv);
        String::from_utf8_lossy(&out.stdout).contains(ip)
    }
}
