/* nmbatch dashboard: the math of the centroid map, loaded before dashboard.js.
 *
 * pca2(rows, previousAxes): the first two principal components of the k centroids
 * (k x d numbers), by orthogonal iteration on X^T X with a Rayleigh-Ritz step (never a
 * d x d matrix), axis signs kept from the previous version. tinyThreshold(counts): the
 * count under which a cluster is flagged tiny; dot(a, b). Exposed as window.NmbPca.
 */
(function () {
  "use strict";

  /** First two principal components of the rows (k x d numbers): the scores, the axes,
   *  the mean and the share of the variance they hold. Orthogonal iteration on X^T X
   *  (X the centred rows) with a Rayleigh-Ritz step; never forms a d x d matrix. */
  function pca2(rows, previousAxes) {
    const k = rows.length, d = rows[0].length;
    const mean = new Float64Array(d);
    for (const r of rows) for (let i = 0; i < d; i++) mean[i] += r[i] / k;
    const X = rows.map((r) => Float64Array.from(r, (v, i) => v - mean[i]));
    let total = 0;
    for (const x of X) for (let i = 0; i < d; i++) total += x[i] * x[i];
    const project = (v) => X.map((x) => dot(x, v));
    const back = (p) => { // X^T p
      const out = new Float64Array(d);
      X.forEach((x, j) => { for (let i = 0; i < d; i++) out[i] += p[j] * x[i]; });
      return out;
    };
    let V = [largestRow(X, d), seeded(d)];
    orthonormalise(V);
    for (let it = 0; it < 2000; it++) {
      const W = V.map((v) => back(project(v)));
      orthonormalise(W);
      const c00 = dot(V[0], W[0]), c01 = dot(V[0], W[1]);
      const c10 = dot(V[1], W[0]), c11 = dot(V[1], W[1]);
      V = W;
      if (it > 5 && 1 - Math.abs(c00 * c11 - c01 * c10) < 1e-15) break;
    }
    // Rayleigh-Ritz: the 2 x 2 problem in the subspace gives the two components apart.
    const P = V.map(project);
    const h00 = dot(P[0], P[0]), h01 = dot(P[0], P[1]), h11 = dot(P[1], P[1]);
    const theta = 0.5 * Math.atan2(2 * h01, h00 - h11);
    const cs = Math.cos(theta), sn = Math.sin(theta);
    let axes = [V[0].map((v, i) => cs * v + sn * V[1][i]), V[1].map((v, i) => -sn * V[0][i] + cs * v)];
    axes = axes.map((a, n) => orient(a, previousAxes && previousAxes[n]));
    const scores = X.map((x) => [dot(x, axes[0]), dot(x, axes[1])]);
    const shown = scores.reduce((s, [a, b]) => s + a * a + b * b, 0);
    return { scores, axes, mean, explained: total > 0 ? shown / total : 1 };
  }

  function dot(a, b) {
    let s = 0;
    for (let i = 0; i < a.length; i++) s += a[i] * b[i];
    return s;
  }

  function largestRow(X, d) {
    let best = null, bestNorm = 0;
    for (const x of X) { const n = dot(x, x); if (n > bestNorm) { best = x; bestNorm = n; } }
    return best ? Float64Array.from(best) : seeded(d, 7);
  }

  function seeded(d, salt = 1) { // a fixed, generic start vector
    return Float64Array.from({ length: d }, (_, i) => {
      const s = Math.sin((i + 1) * 12.9898 + salt * 78.233) * 43758.5453;
      return s - Math.floor(s) - 0.5;
    });
  }

  function orthonormalise(V) { // Gram-Schmidt; a vanishing vector is replaced by another
    for (let n = 0; n < V.length; n++) {
      for (let attempt = 0; attempt < 3; attempt++) {
        for (let m = 0; m < n; m++) {
          const c = dot(V[n], V[m]);
          for (let i = 0; i < V[n].length; i++) V[n][i] -= c * V[m][i];
        }
        const norm = Math.sqrt(dot(V[n], V[n]));
        if (norm > 1e-300) { for (let i = 0; i < V[n].length; i++) V[n][i] /= norm; break; }
        V[n] = seeded(V[n].length, n + 3 + attempt);
      }
    }
  }

  function orient(axis, previous) { // same side as before, else largest loading positive
    let sign;
    if (previous && previous.length === axis.length) sign = dot(axis, previous) < 0 ? -1 : 1;
    else {
      let big = 0;
      for (const v of axis) if (Math.abs(v) > Math.abs(big)) big = v;
      sign = big < 0 ? -1 : 1;
    }
    return Float64Array.from(axis, (v) => sign * v);
  }

  /** Counts below this are flagged tiny: a tenth of the mean count. */
  function tinyThreshold(counts) {
    const total = counts.reduce((s, c) => s + c, 0);
    return counts.length ? 0.1 * total / counts.length : 0;
  }

  window.NmbPca = { pca2, tinyThreshold, dot };
})();
