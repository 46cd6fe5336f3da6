use super::*;

fn frontend(addr: &str, version: ProxyVersion, source: &str) -> Frontend {
    let a: SocketAddr = addr.parse().expect("addr");
    Frontend {
        ip: a.ip(),
        port: a.port(),
        version,
        source: Origin::Service(ServiceName::new("ns", source)),
        first_speaker: FirstSpeaker::Client,
        path: PathChoice::Auto,
    }
}

#[test]
fn an_address_has_one_owner_and_a_second_claim_names_it() {
    let mut set = Frontends::new();
    set.insert(frontend("203.0.113.10:80", ProxyVersion::V2, "first"))
        .expect("free");
    let owner = set
        .insert(frontend("203.0.113.10:80", ProxyVersion::V1, "second"))
        .expect_err("taken");
    assert_eq!(owner.source.to_string(), "Service ns/first");
    assert_eq!(set.len(), 1);
    assert_eq!(
        set.get(&"203.0.113.10:80".parse().expect("addr"))
            .map(|f| f.version),
        Some(ProxyVersion::V2)
    );
}

#[test]
fn paths_read_and_write_as_status_spells_them() {
    let both = Paths(vec![LivePath::Relay, LivePath::Hosts]);
    assert_eq!(both.to_string(), "ebpf,hosts");
    assert_eq!("ebpf,hosts".parse::<Paths>(), Ok(both.clone()));
    assert_eq!(Paths::default().to_string(), "none");
    assert_eq!("none".parse::<Paths>(), Ok(Paths::default()));
    assert_eq!(
        serde_json::to_string(&both).expect("json"),
        "\"ebpf,hosts\""
    );
    assert!("ebpf,dns".parse::<Paths>().is_err());
    let kernel = Paths(vec![LivePath::Kernel, LivePath::Hosts]);
    assert_eq!(kernel.to_string(), "kernel,hosts");
    assert_eq!("kernel,hosts".parse::<Paths>(), Ok(kernel));
    assert!(!LivePath::Kernel.is_name_path());
}

#[test]
fn first_speaker_reads_client_or_server_and_defaults_to_client() {
    assert_eq!(" Server ".parse(), Ok(FirstSpeaker::Server));
    assert_eq!("client".parse(), Ok(FirstSpeaker::Client));
    assert_eq!(
        "smtp".parse::<FirstSpeaker>(),
        Err(UnknownWord::new("client or server", "smtp"))
    );
    assert_eq!(
        UnknownWord::new("client or server", "smtp").to_string(),
        "expected client or server, got \"smtp\""
    );
    assert_eq!(FirstSpeaker::default(), FirstSpeaker::Client);
    assert_eq!(FirstSpeaker::Server.to_string(), "server");
}

#[test]
fn services_sort_as_their_names_read_and_origins_say_what_asked() {
    // `-` sorts before `/`: the text order, not the (namespace, name) order.
    let mut names = [ServiceName::new("a", "x"), ServiceName::new("a-b", "x")];
    names.sort();
    assert_eq!(names[0].to_string(), "a-b/x");
    let service = Origin::Service(ServiceName::new("ingress", "nginx"));
    assert_eq!(service.to_string(), "Service ingress/nginx");
    let file = |entry: Option<&str>| Origin::File {
        path: std::path::Path::new("/etc/hairpin/frontends.yaml").into(),
        entry: entry.map(Into::into),
    };
    assert_eq!(
        file(Some("lb6")).to_string(),
        "file /etc/hairpin/frontends.yaml (lb6)"
    );
    assert_eq!(file(None).to_string(), "file /etc/hairpin/frontends.yaml");
}

#[test]
fn path_reads_auto_or_relay_and_defaults_to_auto() {
    assert_eq!(" Relay ".parse(), Ok(PathChoice::Relay));
    assert_eq!("auto".parse(), Ok(PathChoice::Auto));
    assert_eq!(
        "kernel".parse::<PathChoice>(),
        Err(UnknownWord::new("auto or relay", "kernel"))
    );
    assert_eq!(PathChoice::default(), PathChoice::Auto);
    assert_eq!(PathChoice::Relay.to_string(), "relay");
    // A frontend serialized before the field existed reads as `auto`.
    let f: Frontend = serde_json::from_str(
        r#"{"ip":"203.0.113.10","port":80,"version":"v1","source":{"file":{"path":"s"}}}"#,
    )
    .expect("frontend");
    assert_eq!(f.path, PathChoice::Auto);
}

#[test]
fn only_off_leaves_the_kernel_path_unloaded_and_only_on_requires_it() {
    use clap::ValueEnum;
    let modes: Vec<(String, bool, bool)> = KernelPathMode::value_variants()
        .iter()
        .map(|m| (m.to_string(), m.loads(), m.requires()))
        .collect();
    assert_eq!(
        modes,
        [
            ("auto".to_string(), true, false),
            ("on".to_string(), true, true),
            ("off".to_string(), false, false),
        ]
    );
}
