"""Chapter 08, reference solutions: `check.utf8_deltas`, `check.stop_holdback`."""
import codecs


def utf8_deltas(pieces: list[bytes]) -> list[str]:
    """For each token's bytes, the text that became complete with it ("" while a character is cut)."""
    decoder = codecs.getincrementaldecoder("utf-8")()  # keeps the bytes of an unfinished character
    return [decoder.decode(p) for p in pieces]


def stop_holdback(deltas: list[str], stop: list[str]) -> list[str]:
    """What to send after each delta, plus a last entry at the end of the stream.

    Never send a stop string or anything after it. Until then, hold back only the end of the
    text that is the start of some stop string (it may complete with the next delta); at the
    end of the stream, send what was held back.
    """
    out, text, sent, stopped = [], "", 0, False
    for d in deltas:
        if stopped:
            out.append("")
            continue
        text += d
        hits = [i for i in (text.find(s) for s in stop) if i >= 0]
        if hits:
            upto, stopped = min(hits), True
        else:
            hold = max((k for s in stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
            upto = len(text) - hold
        out.append(text[sent:upto])
        sent = upto
    out.append("" if stopped else text[sent:])
    return out
