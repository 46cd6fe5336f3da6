//! The image: deploy/Dockerfile, checked statically (no container engine here).

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
    for f in &froms {
        let image = f
            .split_whitespace()
            .find(|w| !w.starts_with("--") && *w != "FROM")
            .expect("image");
        assert!(
            image.contains(':') && !image.ends_with(":latest"),
            "pin a tag, never latest: {f}"
        );
    }
    assert!(!text.contains(":latest"), "no latest tags anywhere");
    for needle in [
        "ARG TARGETARCH",
        "amd64)",
        "arm64)",
        "cargo xtask build-ebpf",
        "--component rust-src",
        "HAIRPIN_EBPF_OBJECT=",
        "--release",
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
