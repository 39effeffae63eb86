//! One export as the daemon serves it — a vDisk, a vSSD, a region lent to a peer or a
//! replica log kept for one — with who may open it over TLS NBD and over vhost-user-blk.

use cachevisor_trace::VmId;

/// One served export.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Export {
    /// Its VM id in the engine.
    pub id: VmId,
    /// Export name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Client certificates that may open it (`tls_authz.rs`; empty: any client the
    /// listener's TLS policy lets in).
    pub allow: Vec<String>,
    /// Who may open it over vhost-user-blk (`vhost_access.rs`; none by default).
    pub vhost_user: crate::vhost_access::Access,
}

impl Export {
    /// How the NBD handshake offers it.
    pub fn offered(&self) -> cachevisor_nbd::backend::ExportInfo {
        cachevisor_nbd::backend::ExportInfo {
            id: self.id,
            name: self.name.clone(),
            size: self.size,
            allow: self.allow.clone(),
        }
    }
}
