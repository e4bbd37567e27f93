// X25519 (RFC 7748) with the Montgomery ladder over GF(2^255 - 19), field elements as 16 limbs
// of 16 bits held in int64_t. Constant time: no branch or index depends on secret data. Only
// `kioskauthctl fleet keygen` uses it, to print the public half of the key it writes.

#include "kioskauth_x25519.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

typedef int64_t field[16];

static void carry(field o) {
    for (int i = 0; i < 16; i++) {
        o[i] += (int64_t)1 << 16;
        int64_t c = o[i] >> 16;
        if (i < 15) {
            o[i + 1] += c - 1;
        } else {
            o[0] += 38 * (c - 1);
        }
        o[i] -= c << 16;
    }
}

// Swaps p and q when bit is 1, without branching on it.
static void conditional_swap(field p, field q, int64_t bit) {
    int64_t mask = ~(bit - 1);
    for (int i = 0; i < 16; i++) {
        int64_t t = mask & (p[i] ^ q[i]);
        p[i] ^= t;
        q[i] ^= t;
    }
}

static void pack(uint8_t out[32], const field n) {
    field m, t;
    memcpy(t, n, sizeof(field));
    carry(t);
    carry(t);
    carry(t);
    for (int pass = 0; pass < 2; pass++) {
        m[0] = t[0] - 0xffed;
        for (int i = 1; i < 15; i++) {
            m[i] = t[i] - 0xffff - ((m[i - 1] >> 16) & 1);
            m[i - 1] &= 0xffff;
        }
        m[15] = t[15] - 0x7fff - ((m[14] >> 16) & 1);
        int64_t borrow = (m[15] >> 16) & 1;
        m[14] &= 0xffff;
        conditional_swap(t, m, 1 - borrow);
    }
    for (int i = 0; i < 16; i++) {
        out[2 * i] = (uint8_t)(t[i] & 0xff);
        out[2 * i + 1] = (uint8_t)(t[i] >> 8);
    }
}

static void unpack(field o, const uint8_t n[32]) {
    for (int i = 0; i < 16; i++) {
        o[i] = n[2 * i] + ((int64_t)n[2 * i + 1] << 8);
    }
    o[15] &= 0x7fff;
}

static void add(field o, const field a, const field b) {
    for (int i = 0; i < 16; i++) {
        o[i] = a[i] + b[i];
    }
}

static void subtract(field o, const field a, const field b) {
    for (int i = 0; i < 16; i++) {
        o[i] = a[i] - b[i];
    }
}

static void multiply(field o, const field a, const field b) {
    int64_t t[31] = {0};
    for (int i = 0; i < 16; i++) {
        for (int j = 0; j < 16; j++) {
            t[i + j] += a[i] * b[j];
        }
    }
    for (int i = 0; i < 15; i++) {
        t[i] += 38 * t[i + 16];
    }
    memcpy(o, t, sizeof(field));
    carry(o);
    carry(o);
}

static void square(field o, const field a) {
    multiply(o, a, a);
}

// a^(p-2): the inverse, by Fermat.
static void invert(field o, const field a) {
    field c;
    memcpy(c, a, sizeof(field));
    for (int bit = 253; bit >= 0; bit--) {
        square(c, c);
        if (bit != 2 && bit != 4) {
            multiply(c, c, a);
        }
    }
    memcpy(o, c, sizeof(field));
}

void kioskauth_x25519(uint8_t out[32], const uint8_t scalar[32], const uint8_t u[32]) {
    static const field a24 = {0xdb41, 1}; // 121665
    uint8_t z[32];
    memcpy(z, scalar, 32);
    z[31] = (uint8_t)((z[31] & 127) | 64);
    z[0] &= 248;
    field x, a = {1}, b, c = {0}, d = {1}, e, f;
    unpack(x, u);
    memcpy(b, x, sizeof(field));
    for (int i = 254; i >= 0; i--) {
        int64_t bit = (z[i >> 3] >> (i & 7)) & 1;
        conditional_swap(a, b, bit);
        conditional_swap(c, d, bit);
        add(e, a, c);
        subtract(a, a, c);
        add(c, b, d);
        subtract(b, b, d);
        square(d, e);
        square(f, a);
        multiply(a, c, a);
        multiply(c, b, e);
        add(e, a, c);
        subtract(a, a, c);
        square(b, a);
        subtract(c, d, f);
        multiply(a, c, a24);
        add(a, a, d);
        multiply(c, c, a);
        multiply(a, d, f);
        multiply(d, b, x);
        square(b, e);
        conditional_swap(a, b, bit);
        conditional_swap(c, d, bit);
    }
    invert(c, c);
    multiply(a, a, c);
    pack(out, a);
    memset(z, 0, sizeof z);
}

int kioskauth_x25519_keygen(uint8_t private_key[32], uint8_t public_key[32]) {
    size_t filled = 0;
    while (filled < 32) {
        ssize_t got = getrandom(private_key + filled, 32 - filled, 0);
        if (got < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -errno;
        }
        filled += (size_t)got;
    }
    static const uint8_t base[32] = {9};
    kioskauth_x25519(public_key, private_key, base);
    return 0;
}
