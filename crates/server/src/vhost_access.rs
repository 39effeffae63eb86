//! Who may open an export over vhost-user-blk. A vhost-user socket has
//! no certificates: whoever can connect to the file is the VM's disk. So an export that
//! restricts its NBD clients — an `allow` list, or `listen.tls = "require"` — gets no
//! vhost-user socket unless the operator names who may open it, per export:
//! `vhost_user = "owner"` (0600: the daemon's user only, e.g. QEMU run as that user) or
//! `vhost_user = "group:NAME"` (0660 with that group, e.g. the hypervisor's). Other exports
//! follow `listen.unix_mode` / `unix_group`, as before; `vhost_user = "none"` keeps any
//! export off vhost-user. A cluster's lent regions and replica logs are never offered
//! (they are other nodes' data, for their certificates only). `serve --check-config` and
//! the start banner list who may open what ([`describe`]).

/// Who may open an export's vhost-user socket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Access {
    /// No socket.
    #[default]
    None,
    /// `listen.unix_mode` and `listen.unix_group`.
    Listen,
    /// 0600: the daemon's user only.
    Owner,
    /// 0660 with this group.
    Group(String),
}

/// Parses an export's `vhost_user` value (`at` names the key in errors).
fn parse(value: &str, at: &str) -> Result<Access, String> {
    match value {
        "none" => Ok(Access::None),
        "owner" => Ok(Access::Owner),
        v => match v.strip_prefix("group:") {
            Some(g) if !g.is_empty() => Ok(Access::Group(g.to_string())),
            _ => Err(format!("{at}: `{value}`: use \"none\", \"owner\" or \"group:NAME\"")),
        },
    }
}

/// Checks an export's `vhost_user` value.
pub fn check(value: Option<&str>, at: &str) -> Result<(), String> {
    value.map(|v| parse(v, at)).transpose().map(drop)
}

/// The access an export gets: its `vhost_user` when set, else none when it restricts
/// its NBD clients (`allow`, or `tls_required`), else the listener's.
pub fn of(value: Option<&str>, allow: &[String], tls_required: bool) -> Access {
    match value.and_then(|v| parse(v, "").ok()) {
        Some(a) => a,
        None if !allow.is_empty() || tls_required => Access::None,
        None => Access::Listen,
    }
}

/// Why an export has no socket, or who may open it, in words (`listen` describes the
/// listener's mode and group).
pub fn describe(a: &Access, allow: &[String], tls_required: bool, listen: &str) -> String {
    match a {
        Access::None if !allow.is_empty() => {
            "not offered: it has `allow` (TLS clients only); set vhost_user = \"owner\" or \"group:NAME\" to let local VMs open it".into()
        }
        Access::None if tls_required => "not offered: listen.tls = \"require\"; set vhost_user = \"owner\" or \"group:NAME\" to let local VMs open it".into(),
        Access::None => "not offered (vhost_user = \"none\")".into(),
        Access::Listen => listen.to_string(),
        Access::Owner => "mode 0600: the daemon's user only (vhost_user = \"owner\")".into(),
        Access::Group(g) => format!("mode 0660, group `{g}` (vhost_user = \"group:{g}\")"),
    }
}

/// For `serve --check-config` and the start banner: one line per export of `cfg` saying
/// who may open it over vhost-user (nothing without `listen.vhost_user`).
pub fn report(cfg: &crate::config::Config) -> Vec<String> {
    if cfg.listen.vhost_user.is_none() {
        return Vec::new();
    }
    let tls = cfg.listen.tls == cachevisor_nbd::tls::TlsMode::Require;
    let listen = match &cfg.listen.unix_group {
        Some(g) => format!("mode {}, group `{g}` (listen.unix_mode, unix_group)", cfg.listen.unix_mode),
        None => format!("mode {} (listen.unix_mode)", cfg.listen.unix_mode),
    };
    let vssds = cfg.vssd.iter().flat_map(|v| v.device.iter().map(|d| (&d.name, &d.vhost_user, &d.allow)));
    cfg.vdisk
        .iter()
        .map(|v| (&v.name, &v.vhost_user, &v.allow))
        .chain(vssds)
        .map(|(name, value, allow)| {
            let a = of(value.as_deref(), allow, tls);
            format!("vhost-user {name}: {}", describe(&a, allow, tls, &listen))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restricted_exports_are_offered_only_to_whom_the_operator_names() {
        let allow = vec!["CN=host-a".to_string()];
        assert_eq!(of(None, &[], false), Access::Listen);
        assert_eq!(of(None, &allow, false), Access::None);
        assert_eq!(of(None, &[], true), Access::None);
        assert_eq!(of(Some("owner"), &allow, true), Access::Owner);
        assert_eq!(of(Some("group:kvm"), &allow, false), Access::Group("kvm".into()));
        assert_eq!(of(Some("none"), &[], false), Access::None);
        for bad in ["", "group:", "everyone", "Owner"] {
            assert!(check(Some(bad), "vdisk[0] (a).vhost_user").unwrap_err().starts_with("vdisk[0] (a).vhost_user"));
        }
        assert!(describe(&Access::None, &allow, false, "").contains("allow"));
        assert!(describe(&Access::None, &[], true, "").contains("require"));
    }
}
