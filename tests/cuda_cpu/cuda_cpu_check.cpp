// cuda_cpu_check.cpp: runs the kernel checks (cuda_cpu_check.h).
//
//   cuda_cpu_check [--runs N] [--list] [NAME...]
//
// Runs every case whose name starts with one of the NAMEs (all without any),
// each N times (default 2: in order, then reversed), and prints one JSON line
// per case: {"case", "kernels", "errors": {output: {"norm", "row", "bound",
// "row_bound"}}, "failures", "bitwise_repeat", "hazards", "hazard_reports"}.
// tests/cuda_cpu/test_kernels.py holds it to the bounds. Exit 0 when every
// case ran (whatever its results), 2 on bad arguments, 3 when a kernel did
// something the GPU would hang or trap on (cuda_on_cpu.cpp says what).
#include "cuda_on_cpu.h"
#include "cuda_cpu_check.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <set>

namespace check {

static std::vector<Case> &cases() {
    static std::vector<Case> all;
    return all;
}

int add_case(const std::string &name, std::function<void(Run &)> fn) {
    cases().push_back({name, fn});
    return 0;
}

double Rng::uniform() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return ((s * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
}

float Rng::normal() {
    double u = uniform() + 1e-300, v = uniform();
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

int Rng::below(int n) { return (int)(uniform() * n); }

void Run::output(const char *name, const void *p, size_t bytes) {
    outputs.push_back({name, std::vector<unsigned char>((const unsigned char *)p, (const unsigned char *)p + bytes)});
}

void Run::fail(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    failures.push_back(msg);
}

static std::string json_number(double x) {
    if (!isfinite(x)) return "null";
    char buf[64];
    snprintf(buf, sizeof buf, "%.3e", x);
    return buf;
}

static std::string json_string(const std::string &s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') out += '\\', out += (char)c;
        else if (c < 0x20) {
            char buf[8];
            snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
        } else out += (char)c;
    }
    return out + "\"";
}

void Run::compare(const char *name, const std::vector<double> &got, const std::vector<double> &ref, size_t row_len,
                  double bound, double row_bound) {
    if (got.size() != ref.size() || !row_len || ref.size() % row_len) {
        fail("%s: %zu values against %zu reference values in rows of %zu", name, got.size(), ref.size(), row_len);
        return;
    }
    double e2 = 0, r2 = 0, worst = 0;
    size_t nonfinite = 0, rows = ref.size() / row_len;
    for (size_t r = 0; r < rows; r++) {
        double re = 0;
        for (size_t i = r * row_len; i < (r + 1) * row_len; i++) {
            if (!isfinite(got[i])) nonfinite++;
            double d = got[i] - ref[i];
            re += d * d;
            r2 += ref[i] * ref[i];
        }
        e2 += re;
        worst = std::max(worst, re);
    }
    double norm = sqrt(e2) / std::max(sqrt(r2), 1e-300), row = sqrt(worst) / std::max(sqrt(r2 / rows), 1e-300);
    if (nonfinite) fail("%s: %zu of %zu values are not finite (unwritten, or NaN read)", name, nonfinite, got.size());
    if (!(norm <= bound)) fail("%s: norm-relative error %.3g > %.3g", name, norm, bound);
    if (!(row <= row_bound)) fail("%s: worst-row error %.3g > %.3g", name, row, row_bound);
    errors.push_back(json_string(name) + ":{\"norm\":" + json_number(norm) + ",\"row\":" + json_number(row) +
                     ",\"bound\":" + json_number(bound) + ",\"row_bound\":" + json_number(row_bound) + "}");
}

}  // namespace check

// The kernel's base name: "attention_forward_kernel<Tx, HD>" -> "attention_forward_kernel".
static std::string base_name(const std::string &launched) {
    std::string s = launched.substr(0, launched.find('<'));
    while (!s.empty() && s.back() == ' ') s.pop_back();
    size_t colon = s.rfind("::");
    return colon == std::string::npos ? s : s.substr(colon + 2);
}

int main(int argc, char **argv) {
    int runs = 2;
    bool list = false;
    std::vector<std::string> names;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--runs") && i + 1 < argc) {
            runs = atoi(argv[++i]);
            if (runs < 1 || runs > 2) {
                fprintf(stderr, "cuda_cpu_check: --runs is 1 or 2\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--list")) {
            list = true;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "usage: cuda_cpu_check [--runs 1|2] [--list] [NAME...]\n");
            return 2;
        } else {
            names.push_back(argv[i]);
        }
    }
    for (const check::Case &c : check::cases()) {
        bool selected = names.empty();
        for (const std::string &n : names) selected |= c.name.compare(0, n.size(), n) == 0;
        if (!selected) continue;
        if (list) {
            printf("%s\n", c.name.c_str());
            continue;
        }
        std::vector<check::Run> done(runs);
        std::set<std::string> kernels;
        long hazards = 0;
        std::vector<std::string> reports;
        for (int r = 0; r < runs; r++) {
            check::Run &run = done[r];
            run.schedule = r;
            cuda_on_cpu::set_schedule(r);
            c.fn(run);
            cuda_on_cpu::device_free_all();
            for (const std::string &k : cuda_on_cpu::take_launched()) kernels.insert(base_name(k));
            long h = cuda_on_cpu::hazard_count();
            hazards = h < 0 ? -1 : hazards + h;
            for (const std::string &m : cuda_on_cpu::take_hazard_reports()) reports.push_back(m);
        }
        bool repeat = true;
        std::string differ;
        if (runs == 2) {
            if (done[0].outputs.size() != done[1].outputs.size()) repeat = false;
            for (size_t i = 0; repeat && i < done[0].outputs.size(); i++)
                if (done[0].outputs[i] != done[1].outputs[i]) {
                    repeat = false;
                    differ = done[0].outputs[i].first;
                }
        }
        std::string line = "{\"case\":" + check::json_string(c.name) + ",\"kernels\":[";
        bool first = true;
        for (const std::string &k : kernels) line += (first ? "" : ",") + check::json_string(k), first = false;
        line += "],\"errors\":{";
        first = true;
        for (const std::string &e : done[0].errors) line += (first ? "" : ",") + e, first = false;
        line += "},\"failures\":[";
        first = true;
        std::set<std::string> seen;
        for (const check::Run &run : done)
            for (const std::string &f : run.failures)
                if (seen.insert(f).second) line += (first ? "" : ",") + check::json_string(f), first = false;
        line += "],\"runs\":" + std::to_string(runs) + ",\"bitwise_repeat\":" + (runs < 2 ? "null" : repeat ? "true" : "false");
        if (!repeat) line += ",\"differs\":" + check::json_string(differ);
        line += ",\"hazards\":" + (hazards < 0 ? std::string("null") : std::to_string(hazards)) + ",\"hazard_reports\":[";
        first = true;
        for (const std::string &m : reports) line += (first ? "" : ",") + check::json_string(m), first = false;
        line += "]}";
        printf("%s\n", line.c_str());
        fflush(stdout);
    }
    return 0;
}
