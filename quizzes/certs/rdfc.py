"""RDF Dataset Canonicalization (RDFC-1.0, pyld's URDNA2015) for the eddsa-rdfc-2022 cryptosuite, bounded.

eddsa-rdfc-2022 signs the credential's meaning (its RDF statements in canonical N-Quads) rather than its JSON
bytes; 1EdTech's Open Badges 3.0 issuer certification lists it. Its hazards, each closed here:

- Contexts: expansion loads the documents named in @context. The loader serves only the bundled, pinned copies
  (quizzes.certs.contexts) and refuses every other URL, so nothing is fetched and no server decides the meaning.
- Unsigned text: JSON-LD silently drops a key that no context defines (the final VC 2.0 context has no @vocab),
  so RDF canonicalization would not sign it, and a verifier that reads the JSON would show it. A dropped key is
  refused here instead (JSON-LD's "safe mode", through pyld's on_property_dropped).
- Escaping: RDFC-1.0 (section 4.3, canonical N-Quads) writes a literal's BS, HT, LF, FF, CR, '"' and '\\' as
  \\b \\t \\n \\f \\r \\" \\\\, every other character of U+0000-U+001F and U+007F as \\uXXXX (upper-case hex), and
  an IRI's U+0000-U+0020 <>"{}|^`\\ as \\uXXXX. pyld 3.3's serializer (pyld.nquads.serialize_nquad) escapes only
  \\ \\t \\n \\r and '"', so a string holding U+0001, U+0008, U+000B, U+000C or U+007F canonicalizes to other bytes
  than in rdf-canonize (jsonld.js), and Digital Bazaar's and DCC's verifiers reject the signature. The canonicalizer
  here runs pyld's URDNA2015 with `serialize_nquad` below in place of pyld's (the escaping of rdf-canonize 5's
  lib/NQuads.js, which implements RDFC-1.0), both for the blank-node hashes and for the output.
- Cost: canonicalizing a graph of blank nodes that cannot be told apart by their own statements ("poison
  graphs") takes time factorial in their number. Credentials this package makes never need that step (every
  blank node has distinct statements), so the N-degree step is refused instead of run: canonicalization stays
  proportional to the document, whatever an attacker puts in it up to the file size cap.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from .contexts import Loader, document_loader
from .display import shown
from .errors import CertError

XSD_STRING = "http://www.w3.org/2001/XMLSchema#string"
RDF_LANGSTRING = "http://www.w3.org/1999/02/22-rdf-syntax-ns#langString"
_LITERAL_ECHAR = {0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r", 0x22: '\\"', 0x5C: "\\\\"}
# str.translate tables: RDFC-1.0's ECHAR for seven characters, UCHAR \\uXXXX for the other C0 controls and DEL
LITERAL_ESCAPES = {c: _LITERAL_ECHAR.get(c, f"\\u{c:04X}") for c in (*range(0x20), 0x7F, 0x22, 0x5C)}
IRI_ESCAPES = {c: f"\\u{c:04X}" for c in (*range(0x21), *map(ord, '<>"{}|^`\\'))}


def _term(component: dict[str, Any]) -> str:
    if component["type"] == "IRI":
        return "<" + component["value"].translate(IRI_ESCAPES) + ">"
    return component["value"]  # a blank node label (_:c14n0), never escaped


def serialize_nquad(quad: dict[str, Any], graph_name: str | None = None) -> str:
    """One quad in canonical N-Quads (RDFC-1.0 section 4.3), with its line feed: pyld's serialize_nquad with
    RDFC-1.0's escapes (rdf-canonize's NQuads.serializeQuad)."""
    line = _term(quad["subject"]) + " " + _term(quad["predicate"]) + " "
    obj = quad["object"]
    if obj["type"] == "literal":
        line += '"' + obj["value"].translate(LITERAL_ESCAPES) + '"'
        if obj["datatype"] == RDF_LANGSTRING:
            if obj.get("language"):
                line += "@" + obj["language"]
        elif obj["datatype"] != XSD_STRING:
            line += "^^<" + obj["datatype"].translate(IRI_ESCAPES) + ">"
    else:
        line += _term(obj)
    graph = quad.get("name", {"value": graph_name})["value"]
    if graph is not None:
        line += " " + (graph if graph.startswith("_:") else "<" + graph.translate(IRI_ESCAPES) + ">")
    return line + " .\n"


def _with_rdfc_escaping(method: Callable[..., Any]) -> Callable[..., Any]:
    """pyld's URDNA2015 method as it is, but calling this module's serialize_nquad: the same code object with
    its module globals, `serialize_nquad` replaced (pyld's module itself is left alone)."""
    import pyld.canon

    names = {**vars(pyld.canon), "serialize_nquad": serialize_nquad}
    return types.FunctionType(method.__code__, names, method.__name__, method.__defaults__, method.__closure__)


def canonize(document: dict[str, Any], loader: Loader | None = None) -> str:
    """The canonical N-Quads of a JSON-LD document; CertError if it cannot be expanded or needs N-degree hashing."""
    from pyld import jsonld
    from pyld.canon import URDNA2015
    from pyld.context_resolver import ContextResolver

    class _FirstDegreeOnly(URDNA2015):
        main = _with_rdfc_escaping(URDNA2015.main)
        hash_first_degree_quads = _with_rdfc_escaping(URDNA2015.hash_first_degree_quads)

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
