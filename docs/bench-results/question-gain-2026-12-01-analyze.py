import json, sys, statistics as st
cases, upr = {}, {}
for f in sys.argv[1:]:
    for line in open(f, errors='replace'):
        if line.startswith('EXPCASE '):
            c = json.loads(line[8:]); cases[(f, c['question'])] = c
        elif line.startswith('EXPUPR '):
            u = json.loads(line[7:]); upr.setdefault((f, u['question']), u)
mean = lambda xs: sum(xs) / max(1, len(xs))
rows = []
for k, c in cases.items():
    u = upr.get(k)
    if not u: continue
    base = u['base_lp']
    ps = [p['lp'] for p in u['passages']]
    s = {}
    if ps and base:
      s['pmi_mean'] = max(mean(p) for p in ps) - mean(base)
      s['pmi_sum'] = max(sum(p) for p in ps) - sum(base)
    # per-token max over passages, then PMI
      tokmax = [max(p[i] for p in ps) for i in range(len(base))]
      s['pmi_tokmax'] = mean(tokmax) - mean(base)
      s['frac_better'] = max(mean([1.0 if p[i] - base[i] > 1.0 else 0.0 for i in range(len(base))]) for p in ps)
    if u.get('joint') and u.get('nodocs'):
        j, n = u['joint'], u['nodocs']
        s['joint_pmi'] = mean(j) - mean(n)
        s['joint_sum'] = sum(j) - sum(n)
    rows.append(dict(held=c['abstain'], lang=c['lang'], s=s, abst=c['abstained'], right=c['right_fact']))
held = [r for r in rows if r['held']]; ans = [r for r in rows if not r['held']]
print(f"{len(rows)} joined: {len(held)} held out, {len(ans)} answerable; model's own abstention on held out {mean([r['abst'] for r in held]):.0%}, answerable right {mean([r['right'] for r in ans]):.0%}")
keys = sorted({k for r in rows for k in r['s']})
for key in keys:
    h = sorted(r['s'][key] for r in held if key in r['s']); a = sorted(r['s'][key] for r in ans if key in r['s'])
    if not h or not a: continue
    line = f"{key:14s} median held {st.median(h):7.3f} ans {st.median(a):7.3f} |"
    for lose in [0.03, 0.05, 0.10]:
        thr = a[int(lose * len(a))]
        lost = mean([x < thr for x in a]); caught = mean([x < thr for x in h])
        withm = mean([r['s'][key] < thr or r['abst'] for r in held if key in r['s']])
        line += f" lose {lost:.0%}: refuse {caught:.0%} (+model {withm:.0%}) |"
    print(line)
for lang in sorted({r['lang'] for r in rows}):
    for key in ['pmi_mean', 'joint_pmi']:
        h = sorted(r['s'].get(key, 0) for r in held if r['lang'] == lang); a = sorted(r['s'].get(key, 0) for r in ans if r['lang'] == lang)
        if a: print(lang, key, 'held', [round(x, 2) for x in h], 'ans 5/10/50%', [round(a[int(p * len(a))], 2) for p in (0.05, 0.1, 0.5)])
