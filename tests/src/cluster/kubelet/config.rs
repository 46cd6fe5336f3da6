//! The configuration files of the node's runtime: containerd's (CRI plugin, runc
//! with cgroupfs, `restrict_oom_score_adj`), the CNI network's (ptp) and the
//! kubelet's.

use std::fs;

use super::{NodeRuntime, PAUSE_IMAGE};
use crate::{
    cluster::Cluster,
    node::{NODE_IP4, NODE_IP6},
};

impl NodeRuntime {
    /// containerd's configuration and the CNI network's.
    pub(super) fn write_containerd_config(&self) {
        fs::create_dir_all(self.dir.join("cni")).expect("cni dir");
        // ptp: a veth per pod, the node IP as each pod's gateway, /32 and /128
        // routes on the node; addresses of both families from the node's pod CIDRs,
        // above the simulated pod's (dual-stack pods, as the API server serves).
        let cni = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "hairpin-sim",
            "plugins": [{
                "type": "ptp",
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "ranges": [
                        [{
                            "subnet": "192.0.2.0/24",
                            "rangeStart": "192.0.2.100",
                            "rangeEnd": "192.0.2.199",
                            "gateway": NODE_IP4,
                        }],
                        [{
                            "subnet": "2001:db8:1::/64",
                            "rangeStart": "2001:db8:1::100",
                            "rangeEnd": "2001:db8:1::1ff",
                            "gateway": NODE_IP6,
                        }],
                    ],
                    "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
                    "dataDir": self.path("cni-ipam"),
                },
            }],
        });
        fs::write(
            self.dir.join("cni/10-hairpin-sim.conflist"),
            serde_json::to_string_pretty(&cni).expect("json"),
        )
        .expect("cni config");
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{sock}"

[ttrpc]
  address = "{sock}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # No process here may lower its oom_score_adj (no CAP_SYS_RESOURCE).
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
    max_conf_num = 1
"#,
            root = self.path("containerd-root"),
            state = self.path("containerd-state"),
            sock = self.socket.display(),
            opt = self.path("containerd-opt"),
            cni = self.path("cni"),
        );
        fs::write(self.dir.join("containerd.toml"), config).expect("containerd config");
    }

    /// The kubelet's configuration file and kubeconfig.
    pub(super) fn write_kubelet_config(&self, cluster: &Cluster) {
        cluster.node_kubeconfig(&self.dir.join("kubelet.kubeconfig"), "kubelet-token");
        let config = serde_json::json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            // 1.35+ refuse cgroup v1 without it; this machine has v1 controllers.
            "failCgroupV1": false,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": format!("/{}", self.cgroup_name),
            "containerRuntimeEndpoint": format!("unix://{}", self.socket.display()),
            "authentication": {
                "anonymous": {"enabled": false},
                "webhook": {"enabled": true},
                "x509": {"clientCAFile": cluster.ca_cert()},
            },
            "authorization": {"mode": "Webhook"},
            "clusterDNS": [crate::cluster::dns::DNS_IP],
            "clusterDomain": "cluster.local",
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "protectKernelDefaults": true,
            "failSwapOn": false,
            "podLogsDirectory": self.path("pod-logs"),
            // A shared disk's free space is not this node's: no image GC, no
            // eviction for it.
            "imageGCHighThresholdPercent": 100,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "serializeImagePulls": false,
            "rotateCertificates": false,
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "10s",
        });
        fs::write(
            self.dir.join("kubelet.yaml"),
            serde_json::to_string_pretty(&config).expect("json"),
        )
        .expect("kubelet config");
    }
}
