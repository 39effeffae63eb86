//! How the CLI's commands that talk to a running daemon (`status`, `destage`, `prewarm`)
//! reach its HTTP API: `--api HOST:PORT` (plain HTTP, the default), or an `http://` or
//! `https://` URL; an HTTPS API's certificate (`[api] tls = true`: the daemon's
//! `listen.tls` certificate) is checked against `--api-ca` (the CA that signed it, e.g.
//! `TLS_DIR/ca-cert.pem`) or, without it, the system's usual roots.

use anyhow::Context;
use clap::Args;
use std::path::PathBuf;

/// Where the daemon's API is.
#[derive(Debug, Clone, Args)]
pub struct ApiArgs {
    /// The daemon's API: HOST:PORT (HTTP), or an http:// or https:// URL.
    #[arg(long, default_value = "127.0.0.1:10810", global = true)]
    pub api: String,
    /// The CA certificate (PEM) that signed an https:// API's certificate (the daemon's
    /// listen.tls_dir/ca-cert.pem).
    #[arg(long, env = "CACHEVISOR_API_CA", global = true)]
    pub api_ca: Option<PathBuf>,
}

/// A mutating call's arguments: where the API is, its token, and JSON output.
#[derive(Debug, Args)]
pub struct ApiCallArgs {
    #[command(flatten)]
    pub api: ApiArgs,
    /// The API token (also from CACHEVISOR_API_TOKEN).
    #[arg(long, env = "CACHEVISOR_API_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A file holding the API token (`api-token` in the daemon's metadata directory).
    #[arg(long, conflicts_with = "token")]
    pub token_file: Option<PathBuf>,
    /// Print the daemon's answer as JSON.
    #[arg(long)]
    pub json: bool,
}

/// A client of one daemon's API.
pub struct Api {
    base: String,
    agent: ureq::Agent,
}

impl ApiArgs {
    /// The client these arguments name.
    pub fn client(&self) -> anyhow::Result<Api> {
        let base = if self.api.starts_with("http://") || self.api.starts_with("https://") {
            self.api.trim_end_matches('/').to_string()
        } else {
            format!("http://{}", self.api)
        };
        let mut agent = ureq::AgentBuilder::new();
        if let Some(ca) = &self.api_ca {
            let creds = cachevisor_nbd::tls::ClientCredentials { ca: ca.clone(), cert_key: None, check_name: true };
            let config = cachevisor_nbd::tls::client_config(&creds, "--api-ca")
                .map_err(anyhow::Error::msg)
                .context("reading the API's CA certificate")?;
            agent = agent.tls_config(config);
        }
        Ok(Api { base, agent: agent.build() })
    }
}

impl Api {
    /// The URL of `path` (starting with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A GET of `path`.
    pub fn get(&self, path: &str) -> ureq::Request {
        self.agent.get(&self.url(path))
    }

    /// A POST to `path`.
    pub fn post(&self, path: &str) -> ureq::Request {
        self.agent.post(&self.url(path))
    }
}
