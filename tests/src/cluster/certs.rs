//! The control plane's keys, made with the openssl CLI at start: a CA, the API
//! server's serving certificate (the node's addresses, the `kubernetes` Service's
//! cluster IP and names) and the service-account signing key pair. P-256 keys:
//! generating them takes milliseconds.

use std::path::{Path, PathBuf};

use crate::sh::run;

/// Paths of the key material in one directory.
pub struct Pki {
    /// The CA certificate clients trust.
    pub ca_cert: PathBuf,
    /// The API server's certificate.
    pub server_cert: PathBuf,
    /// Its key.
    pub server_key: PathBuf,
    /// The service-account token signing key.
    pub sa_key: PathBuf,
    /// Its public half.
    pub sa_pub: PathBuf,
    /// The API server's client certificate towards kubelets.
    pub kubelet_client_cert: PathBuf,
    /// Its key.
    pub kubelet_client_key: PathBuf,
}

impl Pki {
    /// The paths under `dir`, without making anything.
    pub fn at(dir: &Path) -> Pki {
        Pki {
            ca_cert: dir.join("ca.crt"),
            server_cert: dir.join("apiserver.crt"),
            server_key: dir.join("apiserver.key"),
            sa_key: dir.join("sa.key"),
            sa_pub: dir.join("sa.pub"),
            kubelet_client_cert: dir.join("kubelet-client.crt"),
            kubelet_client_key: dir.join("kubelet-client.key"),
        }
    }

    /// Makes everything under `dir`.
    pub fn make(dir: &Path) -> Pki {
        std::fs::create_dir_all(dir).expect("pki dir");
        let pki = Pki::at(dir);
        let s = |p: &Path| p.to_str().expect("utf-8 path").to_string();
        let ca_key = dir.join("ca.key");
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut argv = vec!["openssl", "req", "-x509"];
        argv.extend_from_slice(&ec);
        let (ca_key_s, ca_cert_s) = (s(&ca_key), s(&pki.ca_cert));
        argv.extend_from_slice(&[
            "-keyout",
            &ca_key_s,
            "-out",
            &ca_cert_s,
            "-days",
            "3",
            "-subj",
            "/CN=hairpin-test-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        run(&argv);
        let csr = dir.join("apiserver.csr");
        let (key_s, csr_s) = (s(&pki.server_key), s(&csr));
        let mut argv = vec!["openssl", "req"];
        argv.extend_from_slice(&ec);
        argv.extend_from_slice(&[
            "-keyout",
            &key_s,
            "-out",
            &csr_s,
            "-subj",
            "/CN=kube-apiserver",
        ]);
        run(&argv);
        let ext = dir.join("apiserver.ext");
        std::fs::write(
            &ext,
            "subjectAltName=IP:192.0.2.1,IP:2001:db8:1::1,IP:127.0.0.1,IP:10.96.0.1,\
             DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,\
             DNS:kubernetes.default.svc.cluster.local,DNS:localhost\n\
             extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n\
             basicConstraints=critical,CA:FALSE\n",
        )
        .expect("extensions file");
        run(&[
            "openssl",
            "x509",
            "-req",
            "-in",
            &csr_s,
            "-CA",
            &ca_cert_s,
            "-CAkey",
            &ca_key_s,
            "-CAcreateserial",
            "-days",
            "3",
            "-out",
            &s(&pki.server_cert),
            "-extfile",
            &s(&ext),
        ]);
        kubelet_client_cert(dir, &pki, &ca_cert_s, &ca_key_s);
        run(&[
            "openssl",
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            &s(&pki.sa_key),
        ]);
        run(&[
            "openssl",
            "pkey",
            "-in",
            &s(&pki.sa_key),
            "-pubout",
            "-out",
            &s(&pki.sa_pub),
        ]);
        pki
    }
}

/// The API server's client certificate towards the kubelet (exec, logs), in
/// system:masters: the kubelet's Webhook authorization allows it, as kubeadm's
/// apiserver-kubelet-client certificate.
fn kubelet_client_cert(dir: &Path, pki: &Pki, ca_cert_s: &str, ca_key_s: &str) {
    let s = |p: &Path| p.to_str().expect("utf-8 path").to_string();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let csr = dir.join("kubelet-client.csr");
    let (key_s, csr_s) = (s(&pki.kubelet_client_key), s(&csr));
    let mut argv = vec!["openssl", "req"];
    argv.extend_from_slice(&ec);
    argv.extend_from_slice(&[
        "-keyout",
        &key_s,
        "-out",
        &csr_s,
        "-subj",
        "/O=system:masters/CN=kube-apiserver-kubelet-client",
    ]);
    run(&argv);
    let ext = dir.join("kubelet-client.ext");
    std::fs::write(
        &ext,
        "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n\
         basicConstraints=critical,CA:FALSE\n",
    )
    .expect("extensions file");
    run(&[
        "openssl",
        "x509",
        "-req",
        "-in",
        &csr_s,
        "-CA",
        ca_cert_s,
        "-CAkey",
        ca_key_s,
        "-CAcreateserial",
        "-days",
        "3",
        "-out",
        &s(&pki.kubelet_client_cert),
        "-extfile",
        &s(&ext),
    ]);
}
