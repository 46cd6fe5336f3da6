//! The image: deploy/Dockerfile, checked statically (`tests/tests/image.rs` runs the
//! image `cargo xtask image` builds with the same layout).

use super::render::{agent, kustomize, read};

#[test]
fn dockerfile_builds_both_arches_and_ships_the_binary_the_daemonset_runs() {
    let text = read("deploy/Dockerfile");
    let froms: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(
        froms.len(),
        3,
        "three stages: ebpf, agent, runtime: {froms:?}"
    );
    for stage in ["AS ebpf", "AS agent", "AS runtime"] {
        assert!(
            froms.iter().any(|f| f.ends_with(stage)),
            "stage {stage} missing: {froms:?}"
        );
    }
    for f in &froms[..2] {
        assert!(
            f.contains("--platform=$BUILDPLATFORM"),
            "build stages run natively and cross-compile: {f}"
        );
    }
    // Every base is pinned by digest (through its ARG default) or is the empty one.
    let arg_default = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("ARG {name}=")))
            .map(str::to_string)
    };
    for f in &froms {
        let image = f
            .split_whitespace()
            .find(|w| !w.starts_with("--") && *w != "FROM")
            .expect("image");
        let image = match image.strip_prefix("${").and_then(|i| i.strip_suffix('}')) {
            Some(arg) => arg_default(arg).unwrap_or_else(|| panic!("ARG {arg} has no default")),
            None => image.to_string(),
        };
        if image == "scratch" {
            continue;
        }
        let digest = image
            .split_once("@sha256:")
            .map(|(_, d)| d)
            .unwrap_or_else(|| panic!("pin {image} by digest: {f}"));
        assert!(
            digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
            "a sha256 digest: {image}"
        );
    }
    assert!(!text.contains(":latest"), "no latest tags anywhere");
    assert!(
        froms[2].starts_with("FROM scratch "),
        "the runtime image is the empty base: {}",
        froms[2]
    );
    for needle in [
        "ARG TARGETARCH",
        "amd64)",
        "arm64)",
        "cargo xtask build-ebpf",
        "--component rust-src",
        "HAIRPIN_EBPF_OBJECT=",
        "--release",
        "cargo build --locked",
        "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS=\"-C target-feature=+crt-static\"",
        "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS=\"-C target-feature=+crt-static\"",
    ] {
        assert!(text.contains(needle), "Dockerfile lacks {needle:?}");
    }
    let runtime = &text[text.find("AS runtime").expect("runtime stage")..];
    assert!(runtime.contains("COPY --from=agent /out/hairpin-agent /usr/local/bin/hairpin-agent"));
    assert!(
        runtime.contains("USER 0:0"),
        "the runtime stage states its user"
    );
    assert!(
        !runtime.contains("apt-get"),
        "the runtime image holds only the binary"
    );
    if let Some(objs) = kustomize("deploy") {
        let c = agent(&objs);
        assert_eq!(
            c.command.as_deref(),
            Some(&["/usr/local/bin/hairpin-agent".to_string()][..])
        );
        let tag = read("deploy/chart/hairpin/Chart.yaml");
        assert!(
            c.image.as_deref().is_some_and(|i| tag.contains(&format!(
                "appVersion: \"{}\"",
                i.rsplit(':').next().unwrap_or_default()
            ))),
            "the kustomize image tag and the chart's appVersion agree"
        );
    }
}
