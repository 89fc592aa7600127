"""RDF Dataset Canonicalization (RDFC-1.0, pyld's URDNA2015) for the eddsa-rdfc-2022 cryptosuite, bounded.

eddsa-rdfc-2022 signs the credential's meaning (its RDF statements in canonical N-Quads) rather than its JSON
bytes; 1EdTech's Open Badges 3.0 issuer certification lists it. Two hazards come with it, and both are closed here:

- Contexts: expansion loads the documents named in @context. The loader serves only the bundled, pinned copies
  (quizzes.certs.contexts) and refuses every other URL, so nothing is fetched and no server decides the meaning.
- Unsigned text: JSON-LD silently drops a key that no context defines (the final VC 2.0 context has no @vocab),
  so RDF canonicalization would not sign it, and a verifier that reads the JSON would show it. A dropped key is
  refused here instead (JSON-LD's "safe mode", through pyld's on_property_dropped).
- Cost: canonicalizing a graph of blank nodes that cannot be told apart by their own statements ("poison
  graphs") takes time factorial in their number. Credentials this package makes never need that step (every
  blank node has distinct statements), so the N-degree step is refused instead of run: canonicalization stays
  proportional to the document, whatever an attacker puts in it up to the file size cap.
"""

from __future__ import annotations

from typing import Any

from .contexts import Loader, document_loader
from .display import shown
from .errors import CertError


def canonize(document: dict[str, Any], loader: Loader | None = None) -> str:
    """The canonical N-Quads of a JSON-LD document; CertError if it cannot be expanded or needs N-degree hashing."""
    from pyld import jsonld
    from pyld.canon import URDNA2015
    from pyld.context_resolver import ContextResolver

    class _FirstDegreeOnly(URDNA2015):
        def hash_n_degree_quads(self, id_: str, issuer: Any) -> Any:
            raise CertError("the document's graph has blank nodes that only N-degree hashing tells apart: "
                            "refused (no credential from this issuer has them, and they can cost factorial time)")

    loader = loader or document_loader()
    options = {
        "documentLoader": loader,
        # a private cache: a context resolved with another loader elsewhere in the process is never reused here
        "contextResolver": ContextResolver({}, loader),
        "processingMode": "json-ld-1.1",
        "produceGeneralizedRdf": False,
        "extractAllScripts": True,
    }
    def dropped(term: str | None) -> None:
        raise CertError(f"the term {shown(term, 60)} is defined by no context, so RDF canonicalization would drop "
                        "it unsigned: refused")

    try:
        dataset = jsonld.JsonLdProcessor(on_property_dropped=dropped).to_rdf(document, options)
    except jsonld.JsonLdError as e:
        cause = e
        while cause.__cause__ is not None:
            cause = cause.__cause__
        if isinstance(cause, CertError):
            raise CertError(str(cause)) from None
        kind = getattr(e, "type", "") or type(e).__name__
        raise CertError(f"the document is not valid JSON-LD for RDF canonicalization ({kind})") from None
    return _FirstDegreeOnly().main(dataset, {"format": "application/n-quads"})
