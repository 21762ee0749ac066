"""Test sentences and the ranking check of the MiniLM verification (issue 14).

Pure Python and numpy, no model: `fusebox_tools.models.minilm_verify` (GPU) and the
size sweep of the benchmark (`minilm_embed --batch B`) use it; the CPU tests
pin its output.

make_sentences(n, seed)
    n English sentences made from word lists and templates, deterministic
    (random.Random(seed), no hashing of str, no download): ten topics (so that
    similarities spread from unrelated to near-paraphrases), lengths from 3 to
    100 words (more short ones than long ones, as in real text: about a third
    under 15 words, a tenth over 80), every sentence distinct. A 100-word
    sentence is about 110-125 WordPiece tokens with [CLS] and [SEP], so at
    S = 128 a few of the longest are truncated (the runner counts them).

ranking_check(ref, got, tie)
    Whether the similarity ranking of sentence pairs is unchanged. The pairs:
    every unordered pair (i < j) of the n sentences, n(n-1)/2 of them; each
    pair's similarity is the cosine of the two embeddings, once from the
    reference (ref) and once from fusebox (got). The ranking is unchanged when
    no two pairs p, q that the reference orders by more than `tie`
    (ref[q] - ref[p] > tie) are ordered the other way or tied by fusebox
    (got[q] <= got[p]). Reference similarities closer than `tie` count as
    equal (either order is accepted). The result names the first disagreement
    in the reference's ascending order (q with the lowest reference similarity
    that some lower-ranked p overtakes, and the p with the highest fusebox
    similarity among them), how many pairs are overtaken, and, for scale, the
    resolution (the largest reference gap between two pairs that fusebox
    orders the other way: the smallest tie at which the check passes),
    Spearman's rank correlation (ties given their average rank) and the
    largest change of a similarity (a resolution can be at most twice that).
"""
import random

import numpy as np

# Ten topics; each: subjects, verbs (third person), objects, places/times, adjectives.
TOPICS = {
    "weather": (["the weather", "a cold wind", "the morning fog", "heavy rain", "the summer sun", "a thunderstorm",
                 "the forecast", "the snow"],
                ["covers", "surprises", "cools", "reaches", "soaks", "brightens", "follows", "delays"],
                ["the valley", "the whole coast", "the old harbour", "our garden", "the mountain roads",
                 "the city streets", "the farmers' fields", "the airport"],
                ["this afternoon", "before sunrise", "all week", "in late October", "after midnight",
                 "during the holidays", "since Monday"],
                ["grey", "warm", "humid", "freezing", "sunny", "windy", "lovely"]),
    "food": (["a man", "the chef", "my grandmother", "the baker", "a hungry child", "the waiter", "our neighbour",
              "the cook"],
             ["eats", "bakes", "serves", "slices", "tastes", "orders", "prepares", "shares"],
             ["a piece of bread", "fresh pasta", "a bowl of soup", "spicy noodles", "a chocolate cake",
              "grilled fish", "a plate of rice", "ripe tomatoes"],
             ["in the small kitchen", "at the market", "for dinner", "on Sunday mornings", "at the corner cafe",
              "before the guests arrive"],
             ["delicious", "salty", "sweet", "crispy", "homemade", "bitter", "warm"]),
    "sport": (["the team", "a young striker", "the goalkeeper", "the coach", "a tennis player", "the runners",
               "the referee", "the captain"],
              ["wins", "trains for", "loses", "watches", "prepares for", "celebrates", "misses", "plays"],
              ["the final match", "a penalty kick", "the championship", "the marathon", "a difficult game",
               "the second half", "the cup", "a long season"],
              ["in the stadium", "on a wet pitch", "after the break", "in front of forty thousand fans",
               "at the national arena", "last Saturday"],
              ["exciting", "tired", "fast", "famous", "nervous", "strong", "brilliant"]),
    "tech": (["the programmer", "a new compiler", "the server", "our database", "the graphics card", "the engineer",
              "the operating system", "a small startup"],
             ["compiles", "optimises", "crashes during", "speeds up", "debugs", "deploys", "rewrites", "tests"],
             ["the neural network", "a matrix multiplication", "the web application", "the kernel driver",
              "a memory leak", "the build system", "the cloud service", "the attention layer"],
             ["in the data centre", "overnight", "on every commit", "before the release", "at scale",
              "with eight GPUs"],
             ["fast", "buggy", "parallel", "efficient", "open-source", "slow", "modern"]),
    "music": (["the orchestra", "a monkey", "the pianist", "a jazz band", "the choir", "the drummer",
               "a street musician", "the singer"],
              ["plays", "rehearses", "records", "performs", "composes", "sings", "tunes", "practises"],
              ["the drums", "a quiet melody", "an old symphony", "the new album", "a folk song", "the guitar",
               "a loud solo", "the opening theme"],
              ["in the concert hall", "on the radio", "at the festival", "every evening", "in the subway",
               "for the wedding"],
             ["loud", "beautiful", "sad", "rhythmic", "gentle", "famous", "strange"]),
    "animals": (["a dog", "the horse", "a white cat", "the elephants", "a small bird", "the fox", "the dolphins",
                 "an old tortoise"],
                ["chases", "sleeps near", "follows", "jumps over", "watches", "hunts", "carries", "finds"],
                ["the ball", "a fence", "the river", "its shadow", "a mouse", "the farmer", "the fish",
                 "the fallen leaves"],
                ["in the forest", "on an enclosed ground", "near the lake", "at dawn", "in the zoo",
                 "across the meadow"],
                ["wild", "playful", "hungry", "clever", "lazy", "shy", "curious"]),
    "travel": (["the tourists", "a pilot", "the train", "my sister", "the bus driver", "a backpacker",
                "the ferry", "the family"],
               ["drives to", "flies to", "visits", "leaves", "explores", "returns to", "books a room in",
                "photographs"],
               ["the stadium", "the old town", "a mountain village", "the capital", "the island",
                "the museum", "a quiet beach", "the cathedral"],
               ["in the summer", "by night", "on a rainy day", "for the first time", "after a long delay",
                "with a map"],
               ["crowded", "expensive", "peaceful", "historic", "remote", "busy", "charming"]),
    "finance": (["the central bank", "an investor", "the company", "the market", "a small business",
                 "the accountant", "the government", "the shareholders"],
                ["raises", "cuts", "invests in", "reports", "borrows", "sells", "buys", "audits"],
                ["interest rates", "the quarterly profits", "new shares", "a large loan", "the budget",
                 "government bonds", "the pension fund", "its debt"],
                ["this quarter", "after the crisis", "in the annual report", "despite inflation",
                 "on Wall Street", "next year"],
                ["risky", "profitable", "stable", "volatile", "cautious", "strong", "weak"]),
    "health": (["the doctor", "a nurse", "the patient", "the hospital", "a researcher", "the surgeon",
                "the pharmacist", "my uncle"],
               ["treats", "examines", "prescribes", "studies", "recovers from", "prevents", "measures",
                "describes"],
               ["a broken arm", "the flu", "high blood pressure", "a rare disease", "the vaccine",
                "a headache", "the infection", "a back injury"],
               ["in the clinic", "after surgery", "every morning", "during the winter", "at the emergency room",
                "for three weeks"],
               ["painful", "serious", "mild", "healthy", "chronic", "careful", "tired"]),
    "science": (["the physicist", "a telescope", "the laboratory", "the students", "a satellite", "the chemist",
                 "the geologist", "the team of astronomers"],
                ["measures", "observes", "discovers", "analyses", "publishes", "predicts", "simulates", "maps"],
                ["a distant galaxy", "the reaction", "the magnetic field", "a new element", "the ocean floor",
                 "the results", "a comet", "the climate model"],
                ["with great precision", "in the experiment", "over ten years", "at the observatory",
                 "in a peer-reviewed paper", "using a supercomputer"],
                ["precise", "surprising", "complex", "theoretical", "bright", "ancient", "accurate"]),
}
CONNECTORS = ["and", "while", "because", "although", "but", "so", "when", "after", "before", "and then",
              "even though", "since"]
# The three sentences of sentence-transformers' README (their similarities are
# the model card's 0.6660, 0.1046, 0.1411) open the list.
README = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
MIN_WORDS, MAX_WORDS = 3, 100


def target_lengths(n, rng):
    """n word counts from MIN_WORDS to MAX_WORDS (both reached when n >= 2),
    denser at the short end (x^1.7 spacing), in a shuffled order."""
    if n == 1:
        return [12]
    lens = [round(MIN_WORDS + (MAX_WORDS - MIN_WORDS) * (k / (n - 1)) ** 1.7) for k in range(n)]
    rng.shuffle(lens)
    return lens


def _clause(rng, topic):
    subj, verb, obj, where, adj = TOPICS[topic]
    s, v, o = rng.choice(subj), rng.choice(verb), rng.choice(obj)
    kind = rng.randrange(4)
    if kind == 0:
        return f"{s} {v} {o}"
    if kind == 1:
        return f"{s} {v} {o} {rng.choice(where)}"
    if kind == 2:
        return f"{s} {v} the {rng.choice(adj)} {o.split(' ', 1)[-1]} {rng.choice(where)}"
    return f"{s} is {rng.choice(adj)} {rng.choice(where)}"


def _sentence(rng, topic, words):
    """One sentence of exactly `words` words, clauses of `topic` (a clause of
    another topic now and then, for pairs between topics)."""
    if words <= 4:  # "Dogs chase the ball." style: subject noun, verb, object noun (+ an adverb)
        subj, verb, obj, _, _ = TOPICS[topic]
        w = [rng.choice(subj).split()[-1].capitalize(), rng.choice(verb).split()[0],
             rng.choice(obj).split()[-1], rng.choice(["today", "again", "outside", "slowly"])][:words]
        return " ".join(w) + rng.choice([".", ".", "!", "?"])
    parts = [_clause(rng, topic)]
    while sum(len(p.split()) for p in parts) < words:
        t = topic if rng.random() < 0.8 else rng.choice(sorted(TOPICS))
        parts.append(rng.choice(CONNECTORS) + " " + _clause(rng, t))
    w = " ".join(parts).split()[:words]
    w[0] = w[0][0].upper() + w[0][1:]
    while w[-1] in CONNECTORS or w[-1] in ("the", "a", "an", "and", "then", "is", "of", "in", "on", "at",
                                            "for", "to", "with", "so", "but", "even", "my", "our", "its"):
        w[-1] = "again" if w[-1] not in ("again",) else "now"  # no sentence ends on a dangling word
    return " ".join(w) + rng.choice([".", ".", ".", "!", "?"])


def make_sentences(n=200, seed=14):
    """n distinct sentences (see the module doc); the same list for the same
    (n, seed) on every machine. The first three are the README's."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"number of sentences must be a positive integer, got {n!r}")
    rng = random.Random(seed)
    topics = sorted(TOPICS)
    out, seen = [], set()
    lens = target_lengths(n, rng)
    for k in range(n):
        if k < len(README) and n >= len(README):
            s = README[k]
        else:
            s = _sentence(rng, topics[k % len(topics)], lens[k])
            tries = 0
            while s in seen:  # short ones can repeat: draw again
                tries += 1
                s = _sentence(rng, topics[(k + tries) % len(topics)], lens[k])
        seen.add(s)
        out.append(s)
    return out


def word_count(s):
    return len(s.split())


# ------------------------------------------------------------------ checks

def cosines(got, ref):
    """Per-row cosine similarity of two [n, d] arrays (float64)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return (got * ref).sum(1) / np.maximum(np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1), 1e-300)


def pair_similarities(emb):
    """(pairs [P, 2] with i < j in row-major order, cosine similarity [P]) of all pairs."""
    e = np.asarray(emb, np.float64)
    e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-300)
    i, j = np.triu_indices(e.shape[0], k=1)
    return np.stack([i, j], axis=1), (e[i] * e[j]).sum(1)


def average_ranks(x):
    """Ranks 1..n of x, tied values sharing their average rank (scipy's rankdata 'average')."""
    x = np.asarray(x)
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    starts = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])
    ends = np.r_[starts[1:], len(xs)]
    avg = (starts + ends + 1) / 2.0  # ranks starts+1 .. ends, averaged
    ranks = np.empty(len(xs))
    ranks[order] = np.repeat(avg, ends - starts)
    return ranks


def spearman(a, b):
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / den) if den > 0 else 1.0


def _overtaken(r, f, tie):
    """(order, sorted r, prefix argmax of f, mask of q overtaken, index of the
    highest-f p below each q) for pairs sorted by r."""
    order = np.argsort(r, kind="mergesort")
    rs, fs = r[order], f[order]
    # p strictly below q by more than tie: rs[p] < rs[q] - tie  <=>  p < searchsorted(rs, rs[q] - tie, 'left')
    lim = np.searchsorted(rs, rs - tie, side="left") - 1  # last such p, -1 if none
    n = len(rs)
    while True:  # rs[q] - tie and rs[q] - rs[p] > tie round differently: the definition decides
        nxt = np.minimum(lim + 1, n - 1)
        up = (lim + 1 < n) & (rs - rs[nxt] > tie)
        cur = np.maximum(lim, 0)
        down = (lim >= 0) & ~(rs - rs[cur] > tie)
        if not (up.any() or down.any()):
            break
        lim = lim + up - down
    best = np.maximum.accumulate(fs)  # prefix max of fs
    arg = np.zeros(len(fs), dtype=np.int64)  # prefix argmax
    run = 0
    for k in range(1, len(fs)):  # O(P), P = n(n-1)/2 (19900 for 200 sentences)
        if fs[k] > fs[run]:
            run = k
        arg[k] = run
    has = lim >= 0
    bad = np.zeros(len(fs), dtype=bool)
    bad[has] = best[lim[has]] >= fs[has]
    below = np.where(has, arg[np.maximum(lim, 0)], -1)
    return order, rs, fs, bad, below


def resolution(ref, got):
    """The largest reference gap r[q] - r[p] > 0 over the pairs p, q that got
    orders the other way or ties (got[p] >= got[q]); 0.0 when got keeps every
    strict order of ref. The ranking check passes iff resolution <= tie."""
    r, f = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    if len(r) < 2:
        return 0.0
    order = np.argsort(r, kind="mergesort")
    rs, fs = r[order], f[order]
    pm = np.maximum.accumulate(fs)
    first = np.searchsorted(pm, fs, side="left")  # earliest p with f[p] >= f[q] (pm is sorted)
    gap = rs - rs[np.minimum(first, len(rs) - 1)]
    gap = np.where(first < np.arange(len(rs)), gap, 0.0)
    return float(max(gap.max(), 0.0))


def ranking_check(ref, got, tie=0.01, pairs=None, sentences=None):
    """See the module doc. ref, got: the similarities of the same pairs [P]
    (pairs [P, 2]: which sentences, for the report). Returns a dict with ok."""
    r, f = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    if r.shape != f.shape or r.ndim != 1:
        raise ValueError(f"similarities must be two 1-D arrays of one length, got {r.shape} and {f.shape}")
    if tie < 0:
        raise ValueError(f"tie must be >= 0, got {tie}")
    out = {"pairs": int(len(r)), "tie": float(tie),
           "definition": "every unordered sentence pair; unchanged when no two pairs whose reference "
                         "similarities differ by more than `tie` are ordered the other way (or tied) by fusebox"}
    if len(r) == 0:
        return dict(out, ok=True, overtaken=0, resolution=0.0, spearman=1.0, max_abs_change=0.0, first=None)
    order, rs, fs, bad, below = _overtaken(r, f, tie)
    out.update(ok=not bad.any(), overtaken=int(bad.sum()), resolution=resolution(r, f),
               spearman=spearman(r, f), max_abs_change=float(np.abs(r - f).max()), first=None)
    if bad.any():
        q = int(np.flatnonzero(bad)[0])
        p = int(below[q])

        def describe(k):
            idx = int(order[k])
            d = {"pair_index": idx, "reference": float(rs[k]), "fusebox": float(fs[k])}
            if pairs is not None:
                i, j = (int(v) for v in pairs[idx])
                d["sentences"] = [i, j]
                if sentences is not None:
                    d["text"] = [sentences[i], sentences[j]]
            return d

        out["first"] = {"higher_in_reference": describe(q), "lower_in_reference": describe(p),
                        "reference_gap": float(rs[q] - rs[p])}
    return out


def worst(cos, k=5):
    """Indices of the k lowest cosines, lowest first."""
    cos = np.asarray(cos)
    return [int(i) for i in np.argsort(cos, kind="mergesort")[:k]]
