//! The log envelope decoder (`schemas/src/codec.rs`) on arbitrary bytes: a
//! damaged log record must come back as a `DecodeError`, never a panic or
//! an allocation the size of a corrupt length prefix. What does decode
//! encodes again to an envelope that decodes to the same event (compared
//! as bytes: damaged bytes can decode to a NaN, which equals nothing).
#![no_main]

use hindsight_schemas::codec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    match codec::decode(bytes) {
        Ok(event) => {
            let again = codec::encode(&event);
            let decoded = codec::decode(&again).expect("an encoded event decodes");
            assert_eq!(codec::encode(&decoded), again);
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
