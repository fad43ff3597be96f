/* The CPU check before main (src/cpu.rs): compiled for the baseline x86-64 whatever the Rust code
 * is built for, so nothing here needs the instructions it looks for. Each NEED_* macro is set by
 * build.rs when the Rust build enables that feature. */
#include <cpuid.h>
#include <unistd.h>

static void say(const char *text) {
    size_t n = 0;
    while (text[n]) n++;
    ssize_t written = write(2, text, n);
    (void)written; /* nowhere else to report a failed write */
}

/* Whether the OS saves the AVX registers (XCR0 bits 1 and 2), which AVX needs besides the CPU. */
static int os_saves_avx(void) {
    unsigned int eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return (eax & 6) == 6;
}

void toolgraph_cpu_check(void) {
    unsigned int a = 0, b = 0, c = 0, d = 0;
    unsigned int c1 = 0, b7 = 0, c81 = 0;
    if (__get_cpuid(1, &a, &b, &c, &d)) c1 = c;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) b7 = b;
    if (__get_cpuid(0x80000001, &a, &b, &c, &d)) c81 = c;
    int avx = (c1 >> 28 & 1) && (c1 >> 27 & 1) && os_saves_avx();
    struct { const char *name; int needed; int present; } features[] = {
        {"avx", NEED_AVX, avx},
        {"avx2", NEED_AVX2, avx && (b7 >> 5 & 1)},
        {"fma", NEED_FMA, avx && (c1 >> 12 & 1)},
        {"f16c", NEED_F16C, avx && (c1 >> 29 & 1)},
        {"bmi1", NEED_BMI1, b7 >> 3 & 1},
        {"bmi2", NEED_BMI2, b7 >> 8 & 1},
        {"lzcnt", NEED_LZCNT, c81 >> 5 & 1},
        {"movbe", NEED_MOVBE, c1 >> 22 & 1},
    };
    unsigned int n = sizeof features / sizeof features[0], missing = 0;
    for (unsigned int i = 0; i < n; i++) missing += features[i].needed && !features[i].present;
    if (!missing) return;
    say("toolgraph: this CPU lacks instructions this build of toolgraph uses:");
    for (unsigned int i = 0; i < n; i++) {
        if (features[i].needed && !features[i].present) {
            say(" ");
            say(features[i].name);
        }
    }
    say(".\nThis build is for x86-64-v3 CPUs (Intel Haswell, 2013, and later; every AMD Zen). "
        "Build one for this CPU:\n"
        "  RUSTFLAGS=\"-C target-cpu=native\" cargo build --release --locked -p toolgraph\n"
        "(the embedding models then run without AVX2, several times slower; docs/deploy.md, \"CPU\").\n");
    _exit(1);
}
