// MathJax settings for the formulas pymdownx.arithmatex marks (mkdocs.yml, generic mode): inline
// math arrives as \( ... \), display math as \[ ... \], each inside an element of class "arithmatex",
// and only those elements are typeset. MathJax itself is loaded after this file (extra_javascript).
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex"
  }
};

// Material for MkDocs swaps page content without a reload when instant navigation is on: typeset
// each new page. Without network MathJax never loads, and the formulas stay as their TeX source.
if (typeof document$ !== "undefined") {
  document$.subscribe(() => {
    if (window.MathJax && window.MathJax.typesetPromise) {
      MathJax.startup.output.clearCache();
      MathJax.typesetClear();
      MathJax.texReset();
      MathJax.typesetPromise();
    }
  });
}
