//! Fuzzes the NBD decoders on arbitrary bytes: request headers, INFO/GO option data, and
//! the range check every command goes through. None may panic; a decoded header must
//! re-encode to the same bytes.
#![no_main]

use cachevisor_nbd::proto::{check_range, decode_info_request, decode_request, encode_request, REQUEST_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode_info_request(data);
    if data.len() >= REQUEST_LEN + 8 {
        let h: &[u8; REQUEST_LEN] = data[..REQUEST_LEN].try_into().unwrap();
        if let Ok(r) = decode_request(h) {
            assert_eq!(&encode_request(&r), h);
            let size = u64::from_le_bytes(data[REQUEST_LEN..REQUEST_LEN + 8].try_into().unwrap());
            if check_range(&r, size).is_ok() && matches!(r.kind, 0 | 1 | 4 | 6) {
                assert!(r.offset + r.length as u64 <= size);
            }
        }
    }
});
