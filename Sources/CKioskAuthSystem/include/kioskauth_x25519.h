#ifndef KIOSKAUTH_X25519_H
#define KIOSKAUTH_X25519_H

#include <stdint.h>

/// Makes an X25519 key pair for `kioskauthctl fleet keygen`, which must not map Foundation (and
/// swift-crypto does): 32 random bytes from getrandom(2) as the private key, and the public key
/// X25519(private, 9) (RFC 7748). Returns 0, or -errno when no randomness could be had. The
/// daemon reads the private key with swift-crypto; a test checks both agree on the public key.
int kioskauth_x25519_keygen(uint8_t private_key[32], uint8_t public_key[32]);

/// X25519(scalar, u) as RFC 7748 §5 defines it (the scalar is clamped here).
void kioskauth_x25519(uint8_t out[32], const uint8_t scalar[32], const uint8_t u[32]);

#endif
