#!/bin/sh
# compare-runs.sh: compare finished ft-train runs side by side (`make compare RUNS="..."`).
#
#   scripts/compare-runs.sh [--plot FILE.svg] RUN_DIR [RUN_DIR ...]
#
# Reads what rank 0 of ft-train writes into each run dir:
#   run_summary.json  one JSON object: strategy, world_size, wall_time_s, steps_per_second,
#                     tokens_per_second, final_train_loss, final_eval_loss (or null),
#                     peak_memory_bytes (one number per rank), ...
#   metrics.jsonl     one JSON object per line: training lines carry "loss", evaluation
#                     lines "eval_loss"; both carry "step".
# Prints a table on stdout, one row per run; speedup is tokens/s over the first run's.
# Writes the loss curves (train loss per step as a line, eval loss as circles, one colour
# per run) as an SVG to FILE (default runs/compare.svg) and names it on stderr.
#
# POSIX sh and awk only (no jq, no gnuplot). Exit status: 0 done, 1 a run dir or file is
# missing or unreadable, 2 bad usage.

set -eu

me=compare-runs
plot=runs/compare.svg

usage() {
    cat <<'EOF'
usage: scripts/compare-runs.sh [--plot FILE.svg] RUN_DIR [RUN_DIR ...]

Compares ft-train runs: a table of strategy, world size, wall time, steps/s, tokens/s,
final train and eval loss, peak memory per rank (MiB, the largest rank) and the speedup
over the first run (tokens/s ratio), and an SVG of the loss curves.

  --plot FILE   where the SVG goes (default runs/compare.svg)
  --help        print this help
EOF
}

die() { echo "$me: error: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case $1 in
    --plot) [ $# -ge 2 ] || { usage >&2; exit 2; }; plot=$2; shift 2 ;;
    --plot=*) plot=${1#--plot=}; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    -*) echo "$me: error: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) break ;;
    esac
done
[ $# -ge 1 ] || { echo "$me: error: no run dirs given" >&2; usage >&2; exit 2; }
[ -n "$plot" ] || { echo "$me: error: --plot needs a file name" >&2; exit 2; }
case $plot in
*.svg|*.SVG) ;;
*) echo "$me: error: --plot $plot: only SVG is written (name the file *.svg)" >&2; exit 2 ;;
esac

for run in "$@"; do
    [ -d "$run" ] || die "$run: no such run dir"
    for f in run_summary.json metrics.jsonl; do
        [ -f "$run/$f" ] || die "$run: no $f in it (rank 0 of ft-train writes it)"
        [ -r "$run/$f" ] || die "$run/$f: not readable"
    done
done

case $plot in */*) mkdir -p "${plot%/*}" ;; esac
# The SVG is written beside its destination and renamed when complete.
tmp="$plot.tmp.$$"
trap 'rm -f "$tmp"' EXIT
: > "$tmp" 2> /dev/null || die "$plot: cannot write the plot there"

awk -v plot="$tmp" -v me="$me" '
# ---- JSON: tokenize, then flatten into J[path] = value ----------------------------
# Paths: a.b for object members, a[0] for array items, a# for an array length. Strings
# are stored without their quotes; numbers, true, false and null as written.
function jtok(s,    n) {
    n = 0
    while (s != "") {
        if (match(s, /^[ \t\r\n]+/)) { s = substr(s, RLENGTH + 1); continue }
        if (match(s, /^"([^"\\]|\\.)*"/) || match(s, /^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?/) ||
            match(s, /^(true|false|null)/) || match(s, /^[][{}:,]/)) {
            TOK[++n] = substr(s, 1, RLENGTH)
            s = substr(s, RLENGTH + 1)
            continue
        }
        return -1
    }
    return n
}
function unq(t) {
    t = substr(t, 2, length(t) - 2)
    gsub(/\\"/, "\"", t); gsub(/\\\//, "/", t); gsub(/\\\\/, "\\", t)
    return t
}
function jval(path,    t, k, i) {
    if (P > NT) { JERR = 1; return }
    t = TOK[P++]
    if (t == "{") {
        if (TOK[P] == "}") { P++; return }
        while (!JERR) {
            k = TOK[P++]
            if (k !~ /^"/ || TOK[P++] != ":") { JERR = 1; return }
            k = unq(k)
            jval(path == "" ? k : path "." k)
            t = TOK[P++]
            if (t == "}") return
            if (t != ",") JERR = 1
        }
        return
    }
    if (t == "[") {
        i = 0
        if (TOK[P] == "]") { P++; J[path "#"] = 0; return }
        while (!JERR) {
            jval(path "[" i "]")
            i++
            t = TOK[P++]
            if (t == "]") { J[path "#"] = i; return }
            if (t != ",") JERR = 1
        }
        return
    }
    if (t ~ /^"/) J[path] = unq(t)
    else if (t ~ /^[-0-9tfn]/) J[path] = t
    else JERR = 1
}
# Parses one JSON object into J; returns 1 when it is one, else 0.
function jparse(s) {
    split("", J); split("", TOK)
    NT = jtok(s)
    if (NT < 2) return 0
    if (TOK[1] != "{") return 0
    P = 1; JERR = 0
    jval("")
    return !JERR && P == NT + 1
}
function isnum(v) { return v ~ /^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$/ }
function fail(msg) { printf "%s: error: %s\n", me, msg > "/dev/stderr"; exit 1 }

# ---- formatting --------------------------------------------------------------------
function num(v, fmt) { return isnum(v) ? sprintf(fmt, v) : "-" }
function xml(s) {
    gsub(/&/, "\\&amp;", s); gsub(/</, "\\&lt;", s); gsub(/>/, "\\&gt;", s); gsub(/"/, "\\&quot;", s)
    return s
}
function basename(p) {
    sub(/\/+$/, "", p)
    if (p == "") return "/"
    sub(/^.*\//, "", p)
    return p
}
# A tick spacing of 1, 2 or 5 times a power of ten giving about n intervals over span.
function nice(span, n,    raw, e, f) {
    if (span <= 0) return 1
    raw = span / n
    e = log(raw) / log(10); e = (e < 0 && e != int(e)) ? int(e) - 1 : int(e)
    f = raw / (10 ^ e)
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * 10 ^ e
}
function floorto(v, s,    q) { q = v / s; q = (q < 0 && q != int(q)) ? int(q) - 1 : int(q); return q * s }
function ceilto(v, s,    q) { q = v / s; q = (q > 0 && q != int(q)) ? int(q) + 1 : int(q); return q * s }
function tick(v) { v = sprintf("%.6g", v); return (v == "-0") ? "0" : v }

# Sorts the steps (keys of the series r, kind) into ORD[1..n]; returns n.
function sortsteps(r, kind,    k, n, i, j, g, t, key) {
    n = 0
    for (key in SER) {
        split(key, k, SUBSEP)
        if (k[1] == r && k[2] == kind) ORD[++n] = k[3] + 0
    }
    for (g = int(n / 2); g > 0; g = int(g / 2))
        for (i = g + 1; i <= n; i++) {
            t = ORD[i]
            for (j = i; j > g && ORD[j - g] > t; j -= g) ORD[j] = ORD[j - g]
            ORD[j] = t
        }
    return n
}

BEGIN {
    nrun = ARGC - 1
    for (r = 1; r <= nrun; r++) {
        dir = ARGV[r]
        ARGV[r] = ""

        file = dir "/run_summary.json"
        text = ""
        while ((rc = (getline line < file)) > 0) text = text line "\n"
        if (rc < 0) fail(file ": cannot read it")
        close(file)
        if (!jparse(text)) fail(file ": not a JSON object")
        NAME[r] = basename(dir)
        STRAT[r] = ("strategy" in J) ? J["strategy"] : "-"
        WORLD[r] = ("world_size" in J) ? J["world_size"] : "-"
        WALL[r] = J["wall_time_s"]; SPS[r] = J["steps_per_second"]
        TPS[r] = J["tokens_per_second"]
        TLOSS[r] = J["final_train_loss"]; ELOSS[r] = J["final_eval_loss"]
        peak = ""
        for (i = 0; i < J["peak_memory_bytes#"]; i++) {
            v = J["peak_memory_bytes[" i "]"]
            if (isnum(v) && (peak == "" || v + 0 > peak + 0)) peak = v
        }
        PEAK[r] = (peak == "") ? "-" : peak / 1048576

        # The curves: the last value logged for a step wins (a resumed run logs its
        # steps after the checkpoint again).
        file = dir "/metrics.jsonl"
        ln = 0
        while ((rc = (getline line < file)) > 0) {
            ln++
            if (line ~ /^[ \t\r]*$/) continue
            if (!jparse(line)) fail(file ":" ln ": not a JSON object")
            if (!isnum(J["step"])) continue
            if (isnum(J["loss"])) SER[r, "train", J["step"] + 0] = J["loss"] + 0
            if (isnum(J["eval_loss"])) SER[r, "eval", J["step"] + 0] = J["eval_loss"] + 0
        }
        if (rc < 0) fail(file ": cannot read it")
        close(file)
    }

    # ---- the table ----
    w = 3
    for (r = 1; r <= nrun; r++) if (length(NAME[r]) > w) w = length(NAME[r])
    hfmt = "%-" w "s  %-14s %5s %9s %8s %10s %10s %10s %10s %8s\n"
    printf hfmt, "run", "strategy", "world", "wall_s", "steps/s", "tokens/s", "train_loss",
        "eval_loss", "peak_MiB", "speedup"
    for (r = 1; r <= nrun; r++) {
        sp = (isnum(TPS[r]) && isnum(TPS[1]) && TPS[1] + 0 > 0) ? sprintf("%.2fx", TPS[r] / TPS[1]) : "-"
        printf hfmt, NAME[r], STRAT[r], WORLD[r], num(WALL[r], "%.1f"), num(SPS[r], "%.2f"),
            num(TPS[r], "%.1f"), num(TLOSS[r], "%.4f"), num(ELOSS[r], "%.4f"),
            num(PEAK[r], "%.1f"), sp
    }

    # ---- the plot ----
    have = 0
    for (key in SER) {
        split(key, k, SUBSEP)
        s = k[3] + 0; v = SER[key]
        if (!have || s < xmin) xmin = s
        if (!have || s > xmax) xmax = s
        if (!have || v < ymin) ymin = v
        if (!have || v > ymax) ymax = v
        have = 1
    }
    if (!have) { xmin = 0; xmax = 1; ymin = 0; ymax = 1 }
    if (xmin > 0) xmin = 0
    if (xmax == xmin) xmax = xmin + 1
    if (ymax == ymin) { ymin -= 0.5; ymax += 0.5 }
    xs = nice(xmax - xmin, 8); x0 = floorto(xmin, xs); x1 = ceilto(xmax, xs)
    ys = nice(ymax - ymin, 6); y0 = floorto(ymin, ys); y1 = ceilto(ymax, ys)

    Wd = 900; Ht = 540; L = 80; R = 30; T = 50; B = 70
    pw = Wd - L - R; ph = Ht - T - B
    split("#1f77b4 #d62728 #2ca02c #ff7f0e #9467bd #8c564b #e377c2 #7f7f7f #bcbd22 #17becf", COL, " ")

    printf "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" > plot
    printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n", Wd, Ht, Wd, Ht > plot
    printf "<title>Loss curves</title>\n" > plot
    printf "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"white\"/>\n", Wd, Ht > plot
    printf "<text x=\"%d\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">Training loss (lines) and eval loss (circles) per step</text>\n", Wd / 2 > plot

    printf "<g class=\"grid\" stroke=\"#e0e0e0\" stroke-width=\"1\">\n" > plot
    for (v = x0; v <= x1 + xs / 2; v += xs) {
        px = L + (v - x0) / (x1 - x0) * pw
        printf "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>\n", px, T, px, T + ph > plot
    }
    for (v = y0; v <= y1 + ys / 2; v += ys) {
        py = T + ph - (v - y0) / (y1 - y0) * ph
        printf "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>\n", L, py, L + pw, py > plot
    }
    printf "</g>\n" > plot

    printf "<g class=\"axes\" stroke=\"black\" stroke-width=\"1\">\n" > plot
    printf "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n", L, T + ph, L + pw, T + ph > plot
    printf "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n", L, T, L, T + ph > plot
    for (v = x0; v <= x1 + xs / 2; v += xs) {
        px = L + (v - x0) / (x1 - x0) * pw
        printf "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>\n", px, T + ph, px, T + ph + 5 > plot
    }
    for (v = y0; v <= y1 + ys / 2; v += ys) {
        py = T + ph - (v - y0) / (y1 - y0) * ph
        printf "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>\n", L - 5, py, L, py > plot
    }
    printf "</g>\n" > plot
    printf "<g class=\"ticks\">\n" > plot
    for (v = x0; v <= x1 + xs / 2; v += xs) {
        px = L + (v - x0) / (x1 - x0) * pw
        printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", px, T + ph + 20, tick(v) > plot
    }
    for (v = y0; v <= y1 + ys / 2; v += ys) {
        py = T + ph - (v - y0) / (y1 - y0) * ph
        printf "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", L - 8, py + 4, tick(v) > plot
    }
    printf "</g>\n" > plot
    printf "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n", L + pw / 2, Ht - 20 > plot
    printf "<text x=\"20\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 20 %d)\">loss</text>\n", T + ph / 2, T + ph / 2 > plot

    for (r = 1; r <= nrun; r++) {
        c = COL[(r - 1) % 10 + 1]
        printf "<g class=\"run\" id=\"run%d\">\n", r > plot
        printf "<title>%s</title>\n", xml(NAME[r]) > plot
        n = sortsteps(r, "train")
        pts = ""
        for (i = 1; i <= n; i++)
            pts = pts sprintf("%s%.1f,%.1f", i > 1 ? " " : "", L + (ORD[i] - x0) / (x1 - x0) * pw,
                              T + ph - (SER[r, "train", ORD[i]] - y0) / (y1 - y0) * ph)
        printf "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"%s\"/>\n", c, pts > plot
        n = sortsteps(r, "eval")
        for (i = 1; i <= n; i++)
            printf "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"white\" stroke=\"%s\" stroke-width=\"2\"/>\n",
                L + (ORD[i] - x0) / (x1 - x0) * pw, T + ph - (SER[r, "eval", ORD[i]] - y0) / (y1 - y0) * ph, c > plot
        printf "</g>\n" > plot
    }

    # Legend: top right inside the plot area, one line per run.
    lw = 0
    for (r = 1; r <= nrun; r++) {
        LEG[r] = NAME[r] " (" STRAT[r] ", " WORLD[r] (WORLD[r] == 1 ? " rank)" : " ranks)")
        if (length(LEG[r]) > lw) lw = length(LEG[r])
    }
    lw = lw * 7 + 40; lx = L + pw - lw - 10; ly = T + 10
    printf "<g class=\"legend\">\n" > plot
    printf "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"white\" fill-opacity=\"0.85\" stroke=\"#999999\"/>\n",
        lx, ly, lw, nrun * 18 + 8 > plot
    for (r = 1; r <= nrun; r++) {
        c = COL[(r - 1) % 10 + 1]; yy = ly + r * 18
        printf "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"/>\n", lx + 6, yy - 4, lx + 30, yy - 4, c > plot
        printf "<text x=\"%d\" y=\"%d\">%s</text>\n", lx + 36, yy, xml(LEG[r]) > plot
    }
    printf "</g>\n</svg>\n" > plot
    close(plot)
}
' "$@"
mv -f "$tmp" "$plot"
echo "$me: loss curves: $plot" >&2
