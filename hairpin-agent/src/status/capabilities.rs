//! `hairpin_kernel_capability`: what this node's kernel lets hairpin run, one gauge
//! per capability (1 available, 0 not), set once the datapath is loaded. What
//! `status` and `doctor` say in words, for alerts across a fleet of mixed kernels.
//! Beside it `hairpin_connect_hook_behind{hook=...}`: 1 while another program runs
//! before hairpin's at a connect hook, where hairpin could not get ahead of it.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

/// A capability the kernel may lack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KernelCapability {
    /// The kernel path: the header written by sock_ops and sk_msg programs.
    KernelPath,
    /// Cgroup links put before the other programs at the hook (`BPF_F_BEFORE`).
    LinkOrder,
    /// MPTCP subflows told apart (and sent to the relay) by the connect programs.
    MptcpDetection,
    /// The relay's bytes spliced in the kernel (sockmap stream verdict).
    KernelSplice,
}

impl KernelCapability {
    /// The `capability` label.
    pub(crate) fn name(self) -> &'static str {
        match self {
            KernelCapability::KernelPath => "kernel_path",
            KernelCapability::LinkOrder => "link_order",
            KernelCapability::MptcpDetection => "mptcp_detection",
            KernelCapability::KernelSplice => "kernel_splice",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CapabilityLabel {
    capability: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HookLabel {
    hook: &'static str,
}

/// The `hairpin_kernel_capability` and `hairpin_connect_hook_behind` families, and
/// the same capabilities as one label of `hairpin_build_info`.
#[derive(Clone, Debug, Default)]
pub(crate) struct KernelCapabilities(
    Family<CapabilityLabel, Gauge>,
    Family<HookLabel, Gauge>,
    std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<&'static str, bool>>>,
);

impl KernelCapabilities {
    /// Sets `capability` to 1 (`available`) or 0.
    pub(crate) fn set(&self, capability: KernelCapability, available: bool) {
        if let Ok(mut m) = self.2.lock() {
            m.insert(capability.name(), available);
        }
        self.0
            .get_or_create(&CapabilityLabel {
                capability: capability.name(),
            })
            .set(i64::from(available));
    }

    /// Sets whether another program runs before hairpin's at the connect hook
    /// `hook` (`connect4`, `connect6`) for processes hairpin means to serve.
    pub(crate) fn set_behind(&self, hook: &'static str, behind: bool) {
        self.1
            .get_or_create(&HookLabel { hook })
            .set(i64::from(behind));
    }

    /// The `kernel_capabilities` label of `hairpin_build_info`: each capability
    /// decided, `name=yes|no`, comma-separated in name order; empty before the
    /// datapath loads.
    pub(crate) fn summary(&self) -> String {
        self.2
            .lock()
            .map(|m| {
                m.iter()
                    .map(|(k, on)| format!("{k}={}", if *on { "yes" } else { "no" }))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default()
    }

    /// Registers the families into `registry`.
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "connect_hook_behind",
            "1 while another program (a socket load balancer) runs before hairpin's at this \
             connect hook for processes hairpin serves, and hides the LB address from it: \
             at the cgroup root on a kernel that cannot order cgroup links where the \
             child cgroups could not be linked, or for processes in the root cgroup itself; \
             `status` and `doctor` name the program",
            self.1.clone(),
        );
        registry.register(
            "kernel_capability",
            "1 for each capability this node's kernel gives hairpin, 0 for one it lacks \
             (kernel_path, link_order: connect links ordered first, mptcp_detection, \
             kernel_splice); `status` and `doctor` say why; none before the datapath loads",
            self.0.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_capability_is_exported_as_set() {
        let caps = KernelCapabilities::default();
        caps.set(KernelCapability::KernelPath, true);
        caps.set(KernelCapability::LinkOrder, false);
        let mut registry = Registry::with_prefix("hairpin");
        caps.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(
            text.contains("hairpin_kernel_capability{capability=\"kernel_path\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("hairpin_kernel_capability{capability=\"link_order\"} 0"),
            "{text}"
        );
        assert!(!text.contains("capability=\"mptcp_detection\""), "{text}");
    }
}
