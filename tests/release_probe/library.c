/* The library tests/release_probe/probe.c opens and closes while it releases: 64 KiB of
 * constants (byte i is i * 7 + 3) and a function that sums them. */
#define E(i) (unsigned char)((i)*7 + 3)
#define D1(i) E(i), E((i) + 1)
#define D2(i) D1(i), D1((i) + 2)
#define D3(i) D2(i), D2((i) + 4)
#define D4(i) D3(i), D3((i) + 8)
#define D5(i) D4(i), D4((i) + 16)
#define D6(i) D5(i), D5((i) + 32)
#define D7(i) D6(i), D6((i) + 64)
#define D8(i) D7(i), D7((i) + 128)
#define D9(i) D8(i), D8((i) + 256)
#define D10(i) D9(i), D9((i) + 512)
#define D11(i) D10(i), D10((i) + 1024)
#define D12(i) D11(i), D11((i) + 2048)
#define D13(i) D12(i), D12((i) + 4096)
#define D14(i) D13(i), D13((i) + 8192)
#define D15(i) D14(i), D14((i) + 16384)
#define D16(i) D15(i), D15((i) + 32768)

const unsigned char probe_table[65536] = {D16(0)};

unsigned probe_sum(void) {
    unsigned sum = 0;
    for (unsigned i = 0; i < sizeof(probe_table); i++)
        sum += probe_table[i];
    return sum;
}
