// Starts Swagger UI on /docs. A file, not an inline script, so the page's
// Content-Security-Policy can refuse every inline script.
"use strict";
(function () {
  const el = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: el.dataset.openapiUrl,
    domNode: el,
    deepLinking: true,
    // never fetch a validator badge from swagger.io
    validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
  });
})();
