use super::*;

#[test]
fn build_info_always_and_the_live_paths_once_decided() {
    let m = Metrics::default();
    let text = m.render();
    let version = env!("CARGO_PKG_VERSION");
    let kernel = nix::sys::utsname::uname()
        .unwrap()
        .release()
        .to_string_lossy()
        .into_owned();
    assert!(
        text.contains(&format!(
            "hairpin_build_info{{version=\"{version}\",kernel=\"{kernel}\",kernel_capabilities=\"\"}} 1"
        )),
        "{text}"
    );
    // Once the datapath has loaded, the kernel's capabilities ride on build_info too.
    use crate::status::capabilities::KernelCapability as Cap;
    m.set_kernel_capability(Cap::LinkOrder, false);
    m.set_kernel_capability(Cap::KernelPath, true);
    assert!(
        m.render()
            .contains("kernel_capabilities=\"kernel_path=yes,link_order=no\"} 1"),
        "{}",
        m.render()
    );
    assert!(!text.contains("hairpin_live_path{"), "{text}");
    m.set_live_paths(&[NodePath::Programs, NodePath::Coredns], true);
    let text = m.render();
    for (path, v) in [("ebpf", 1), ("kernel", 1), ("hosts", 0), ("coredns", 1)] {
        assert!(
            text.contains(&format!("hairpin_live_path{{path=\"{path}\"}} {v}")),
            "{path}: {text}"
        );
    }
}

#[test]
fn kernel_counters_are_read_at_each_scrape_and_exported_by_event() {
    let m = Metrics::default();
    assert!(!m.render().contains("hairpin_kernel_events"));
    let n = Arc::new(std::sync::atomic::AtomicU64::new(3));
    let seen = n.clone();
    m.set_kernel_counters(Arc::new(move || {
        vec![(
            "kernel_headers_written".to_string(),
            seen.load(std::sync::atomic::Ordering::Relaxed),
        )]
    }));
    assert!(
        m.render()
            .contains("hairpin_kernel_events_total{event=\"kernel_headers_written\"} 3"),
        "{}",
        m.render()
    );
    n.store(5, std::sync::atomic::Ordering::Relaxed);
    assert!(
        m.render()
            .contains("hairpin_kernel_events_total{event=\"kernel_headers_written\"} 5")
    );
}
