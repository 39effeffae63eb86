//! Fixed-newstyle negotiation (NBD proto.md "Handshake"): the server greeting, client
//! flags, and option haggling — EXPORT_NAME, GO, INFO, LIST, ABORT, and STARTTLS (the
//! caller runs the TLS handshake and haggles on over it, `listener.rs`). With TLS
//! required, every option before it but STARTTLS and ABORT gets `NBD_REP_ERR_TLS_REQD`
//! (EXPORT_NAME, which has no error reply, closes). An export with an `allow` list is
//! listed and opened only for a client whose verified certificate is on it
//! (`tls_authz.rs`). Every other option is answered "unsupported". A malformed or
//! oversized option closes the connection after an error reply where the spec allows one.

use super::proto::*;
use crate::backend::ExportInfo;
use crate::tls::TlsMode;
use crate::tls_authz::Identity;
use std::io::{self, Read, Write};

/// What the handshake needs of a server: its exports and their block size (the daemon,
/// or a bare data path in tests and benches: `transmission::SingleExport`).
pub trait Exports {
    /// The exports a client may ask for (by name).
    fn exports(&self) -> Vec<ExportInfo>;
    /// The preferred I/O size advertised (the cache's block size).
    fn block_size(&self) -> u64;
    /// The client chose export `id`: called before the reply that tells it so. `false`
    /// closes the connection unanswered — the server let this handshake go meanwhile (a
    /// newer connection took its place), and a client told it is connected must never
    /// find its connection closed under its first request.
    fn entering(&self, _id: u32) -> bool {
        true
    }
}

/// Transmission flags of every export: flush, FUA and write-zeroes are honoured; several
/// connections share one engine and a flush covers all of them, so multi-conn is safe.
pub const TRANSMISSION_FLAGS: u16 = TFLAG_HAS_FLAGS
    | TFLAG_SEND_FLUSH
    | TFLAG_SEND_FUA
    | TFLAG_SEND_WRITE_ZEROES
    | TFLAG_SEND_TRIM
    | TFLAG_CAN_MULTI_CONN
    | TFLAG_SEND_CACHE;

/// The flags of a session: DF only where structured replies were negotiated (the spec).
fn flags_of(session: &Session) -> u16 {
    TRANSMISSION_FLAGS | if session.structured { TFLAG_SEND_DF } else { 0 }
}

/// A connection's standing in the negotiation.
#[derive(Debug, Clone, Default)]
pub struct Session {
    /// The listener's TLS mode.
    pub tls: TlsMode,
    /// TLS is up on this connection.
    pub secured: bool,
    /// The client certificate's names, when TLS verified one.
    pub peer: Option<Identity>,
    /// The client asked for no 124 zero bytes after EXPORT_NAME.
    pub no_zeroes: bool,
    /// Structured replies negotiated.
    pub structured: bool,
    /// The export `base:allocation` was selected for (SET_META_CONTEXT).
    pub allocation_for: Option<String>,
}

/// What transmission may use on the export chosen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replies {
    /// Structured replies (READ as one OFFSET_DATA chunk, errors as ERROR chunks).
    pub structured: bool,
    /// BLOCK_STATUS in `base:allocation`.
    pub allocation: bool,
}

impl Session {
    /// What transmission on export `name` may use.
    pub fn replies(&self, name: &str) -> Replies {
        Replies { structured: self.structured, allocation: self.allocation_for.as_deref() == Some(name) }
    }

    /// Forgets what was negotiated before TLS (the spec: state from before STARTTLS does
    /// not carry over).
    pub fn secure(&mut self) {
        self.secured = true;
        self.structured = false;
        self.allocation_for = None;
    }

    /// Whether this client may see and open `e`.
    fn may_open(&self, e: &ExportInfo) -> bool {
        crate::tls_authz::allows(&e.allow, self.peer.as_ref())
    }
}
/// The outcome of negotiation.
#[derive(Debug, PartialEq, Eq)]
pub enum Negotiated {
    /// Enter transmission on this export (VM id), with what its replies may use.
    Export(u32, Replies),
    /// The client aborted or the handshake failed: close.
    Closed,
    /// STARTTLS was acknowledged: run the TLS handshake, then [`options`] over it.
    StartTls,
}

fn read_u32(s: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    s.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

/// Runs the whole negotiation on `s` for a listener without TLS.
pub fn negotiate<S: Read + Write>(s: &mut S, d: &(impl Exports + ?Sized)) -> io::Result<Negotiated> {
    match greet(s)? {
        Some(mut session) => options(s, d, &mut session),
        None => Ok(Negotiated::Closed),
    }
}

/// Sends the greeting and reads the client's flags: the session to haggle in, or None
/// (unknown flags, not fixed-newstyle: close).
pub fn greet<S: Read + Write>(s: &mut S) -> io::Result<Option<Session>> {
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&hello)?;
    let cflags = read_u32(s)?;
    if cflags & !CLIENT_FLAGS_KNOWN != 0 || cflags & FLAG_C_FIXED_NEWSTYLE == 0 {
        tracing::warn!(cflags, "client flags unknown or not fixed-newstyle: closing");
        return Ok(None);
    }
    Ok(Some(Session { no_zeroes: cflags & FLAG_C_NO_ZEROES != 0, ..Session::default() }))
}

/// Haggles over options until the client picks an export, aborts, or (TLS offered and
/// not yet up) starts TLS.
pub fn options<S: Read + Write>(
    s: &mut S,
    d: &(impl Exports + ?Sized),
    session: &mut Session,
) -> io::Result<Negotiated> {
    let no_zeroes = session.no_zeroes;
    loop {
        let mut h = [0u8; 16];
        s.read_exact(&mut h)?;
        let magic = u64::from_be_bytes(h[0..8].try_into().expect("8 bytes"));
        let opt = u32::from_be_bytes(h[8..12].try_into().expect("4 bytes"));
        let len = u32::from_be_bytes(h[12..16].try_into().expect("4 bytes"));
        if magic != IHAVEOPT {
            tracing::warn!(magic, "bad option magic: closing");
            return Ok(Negotiated::Closed);
        }
        if len > MAX_OPTION_LEN {
            s.write_all(&option_reply(opt, REP_ERR_TOO_BIG, b"option data too large"))?;
            return Ok(Negotiated::Closed);
        }
        let mut data = vec![0u8; len as usize];
        s.read_exact(&mut data)?;
        let find = |name: &str| d.exports().into_iter().find(|e| e.name == name);
        let tls_first = session.tls == TlsMode::Require && !session.secured;
        if tls_first && !matches!(opt, OPT_STARTTLS | OPT_ABORT) {
            if opt == OPT_EXPORT_NAME {
                tracing::info!("EXPORT_NAME before TLS, which is required: closing");
                return Ok(Negotiated::Closed); // it has no error reply
            }
            s.write_all(&option_reply(opt, REP_ERR_TLS_REQD, b"TLS is required: send NBD_OPT_STARTTLS first"))?;
            continue;
        }
        // An export this client may not open is refused as policy, and not listed.
        let refused = |e: &ExportInfo| {
            format!(
                "export `{}` is not open to this client ({})",
                e.name,
                session
                    .peer
                    .as_ref()
                    .map_or("no verified client certificate".into(), |p| format!("certificate {}", p.describe()))
            )
        };
        match opt {
            OPT_EXPORT_NAME => {
                let Some(e) = std::str::from_utf8(&data).ok().and_then(find) else {
                    return Ok(Negotiated::Closed); // the only answer EXPORT_NAME allows
                };
                if !session.may_open(&e) {
                    tracing::warn!("{}: closing", crate::log_safe(&refused(&e)));
                    return Ok(Negotiated::Closed);
                }
                if !d.entering(e.id) {
                    return Ok(Negotiated::Closed);
                }
                let mut b = Vec::with_capacity(10 + 124);
                b.extend_from_slice(&e.size.to_be_bytes());
                b.extend_from_slice(&flags_of(session).to_be_bytes());
                if !no_zeroes {
                    b.extend_from_slice(&[0u8; 124]);
                }
                s.write_all(&b)?;
                return Ok(Negotiated::Export(e.id, session.replies(&e.name)));
            }
            OPT_ABORT => {
                s.write_all(&option_reply(opt, REP_ACK, &[]))?;
                return Ok(Negotiated::Closed);
            }
            OPT_LIST if len != 0 => s.write_all(&option_reply(opt, REP_ERR_INVALID, b"LIST takes no data"))?,
            OPT_LIST => {
                for e in d.exports().into_iter().filter(|e| session.may_open(e)) {
                    let mut b = (e.name.len() as u32).to_be_bytes().to_vec();
                    b.extend_from_slice(e.name.as_bytes());
                    s.write_all(&option_reply(opt, REP_SERVER, &b))?;
                }
                s.write_all(&option_reply(opt, REP_ACK, &[]))?;
            }
            OPT_STARTTLS if len != 0 => s.write_all(&option_reply(opt, REP_ERR_INVALID, b"STARTTLS takes no data"))?,
            OPT_STARTTLS if session.tls == TlsMode::Off => {
                s.write_all(&option_reply(opt, REP_ERR_POLICY, b"TLS is not offered (listen.tls is off)"))?
            }
            OPT_STARTTLS if session.secured => {
                s.write_all(&option_reply(opt, REP_ERR_INVALID, b"TLS is already on"))?
            }
            OPT_STARTTLS => {
                s.write_all(&option_reply(opt, REP_ACK, &[]))?;
                return Ok(Negotiated::StartTls);
            }
            OPT_INFO | OPT_GO => {
                let Some((name, infos)) = decode_info_request(&data) else {
                    s.write_all(&option_reply(opt, REP_ERR_INVALID, b"malformed INFO/GO data"))?;
                    continue;
                };
                // A hidden export gets the very answer a missing one does (the
                // wire must not tell them apart); the daemon's log says which.
                let Some(e) = find(&name).filter(|e| {
                    let open = session.may_open(e);
                    if !open {
                        tracing::warn!("{}", crate::log_safe(&refused(e)));
                    }
                    open
                }) else {
                    s.write_all(&option_reply(opt, REP_ERR_UNKNOWN, unknown_export(&name).as_bytes()))?;
                    continue;
                };
                let mut info = INFO_EXPORT.to_be_bytes().to_vec();
                info.extend_from_slice(&e.size.to_be_bytes());
                info.extend_from_slice(&flags_of(session).to_be_bytes());
                s.write_all(&option_reply(opt, REP_INFO, &info))?;
                if infos.contains(&INFO_BLOCK_SIZE) {
                    let mut b = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
                    b.extend_from_slice(&1u32.to_be_bytes()); // any alignment works
                    b.extend_from_slice(&(d.block_size() as u32).to_be_bytes());
                    b.extend_from_slice(&MAX_PAYLOAD.to_be_bytes());
                    s.write_all(&option_reply(opt, REP_INFO, &b))?;
                }
                if opt == OPT_GO && !d.entering(e.id) {
                    return Ok(Negotiated::Closed);
                }
                s.write_all(&option_reply(opt, REP_ACK, &[]))?;
                if opt == OPT_GO {
                    return Ok(Negotiated::Export(e.id, session.replies(&e.name)));
                }
            }
            OPT_STRUCTURED_REPLY if len != 0 => {
                s.write_all(&option_reply(opt, REP_ERR_INVALID, b"STRUCTURED_REPLY takes no data"))?
            }
            OPT_STRUCTURED_REPLY => {
                session.structured = true;
                s.write_all(&option_reply(opt, REP_ACK, &[]))?
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => s.write_all(&meta_context(opt, &data, session, d))?,
            _ => s.write_all(&option_reply(opt, REP_ERR_UNSUP, b"option not supported"))?,
        }
    }
}

/// The replies to LIST/SET_META_CONTEXT: `base:allocation` is the one context, listed
/// for an empty query list or a `base:` query, selected when asked for by name (SET
/// needs structured replies first, and forgets an earlier selection).
fn meta_context(opt: u32, data: &[u8], session: &mut Session, d: &(impl Exports + ?Sized)) -> Vec<u8> {
    use super::structured::{decode_meta_request, BASE_ALLOCATION, BASE_ALLOCATION_ID};
    let set = opt == OPT_SET_META_CONTEXT;
    if set {
        session.allocation_for = None;
        if !session.structured {
            return option_reply(opt, REP_ERR_INVALID, b"negotiate structured replies first");
        }
    }
    let Some((export, queries)) = decode_meta_request(data) else {
        return option_reply(opt, REP_ERR_INVALID, b"malformed META_CONTEXT data");
    };
    let Some(e) = d.exports().into_iter().find(|e| e.name == export).filter(|e| session.may_open(e)) else {
        return option_reply(opt, REP_ERR_UNKNOWN, unknown_export(&export).as_bytes());
    };
    let wanted = if set {
        queries.iter().any(|q| q == BASE_ALLOCATION)
    } else {
        queries.is_empty() || queries.iter().any(|q| q == BASE_ALLOCATION || q == "base:")
    };
    let mut out = Vec::new();
    if wanted {
        let mut b = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
        b.extend_from_slice(BASE_ALLOCATION.as_bytes());
        out.extend(option_reply(opt, REP_META_CONTEXT, &b));
        if set {
            session.allocation_for = Some(e.name);
        }
    }
    out.extend(option_reply(opt, REP_ACK, &[]));
    out
}

/// The answer to an export that does not exist *or* that this client may not open: the
/// same bytes for both, so a client cannot find hidden exports by their names.
fn unknown_export(name: &str) -> String {
    format!("no export named `{name}` for this client")
}
