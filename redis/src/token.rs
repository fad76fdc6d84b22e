//! Owner tokens and jitter seeds from the OS CSPRNG.

use crate::Error;
use lockwright_core::Token;

/// A fresh owner token: 128 bits from the OS CSPRNG, as 32 lowercase hex digits.
pub fn owner_token() -> Result<Token, Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| Error::Random(e.to_string()))?;
    Ok(token_of(&bytes))
}

/// The token's 32 hex digits, written on the stack and copied once into
/// the token's shared string (one allocation per token).
fn token_of(bytes: &[u8; 16]) -> Token {
    let mut hex = [0u8; 32];
    for (pair, &b) in hex.chunks_exact_mut(2).zip(bytes) {
        pair[0] = HEX[usize::from(b >> 4)];
        pair[1] = HEX[usize::from(b & 0xf)];
    }
    // Hex digits are ASCII, so this cannot fail (and a token is never
    // empty: the default is unreachable). A plain check, where the lossy
    // conversion walked the text in chunks.
    let text = std::str::from_utf8(&hex).unwrap_or("00000000000000000000000000000000");
    Token(std::sync::Arc::from(text))
}

/// An owner token and a jitter seed from one read of the OS CSPRNG.
pub(crate) fn token_and_seed() -> Result<(Token, u64), Error> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).map_err(|e| Error::Random(e.to_string()))?;
    let (token, seed) = bytes.split_at(16);
    let token: [u8; 16] = token.try_into().unwrap_or_default();
    let seed: [u8; 8] = seed.try_into().unwrap_or_default();
    Ok((token_of(&token), u64::from_le_bytes(seed)))
}

/// A seed for the machine's retry jitter.
pub(crate) fn seed() -> Result<u64, Error> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| Error::Random(e.to_string()))?;
    Ok(u64::from_le_bytes(bytes))
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_32_hex_digits_and_differ() {
        let a = owner_token().unwrap().0;
        let b = owner_token().unwrap().0;
        assert_eq!(a.len(), 32);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
    }

    #[test]
    fn token_digits_follow_the_bytes() {
        let mut bytes = [0u8; 16];
        bytes[0] = 0xab;
        bytes[15] = 0x0f;
        assert_eq!(&*token_of(&bytes).0, "ab00000000000000000000000000000f");
    }
}
