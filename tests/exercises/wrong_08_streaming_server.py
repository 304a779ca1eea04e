"""Planted wrong answers for chapter 08."""


def utf8_deltas__each_token_alone(pieces):
    return [p.decode("utf-8", errors="replace") for p in pieces]


def utf8_deltas__everything_at_the_end(pieces):
    data = b"".join(pieces)
    return [""] * (len(pieces) - 1) + [data.decode()]


def stop_holdback__no_holdback(deltas, stop):
    out, text, sent, stopped = [], "", 0, False
    for d in deltas:
        if stopped:
            out.append("")
            continue
        text += d
        hits = [i for i in (text.find(s) for s in stop) if i >= 0]
        upto = min(hits) if hits else len(text)  # sends the start of a stop string before it completes
        stopped = bool(hits)
        out.append(text[max(sent, 0):upto] if upto >= sent else "")
        sent = max(sent, upto)
    out.append("" if stopped else text[sent:])
    return out


def stop_holdback__fixed_holdback(deltas, stop):
    hold = max(len(s) for s in stop) - 1  # always holds this much, even when the tail cannot start a stop
    out, text, sent, stopped = [], "", 0, False
    for d in deltas:
        if stopped:
            out.append("")
            continue
        text += d
        hits = [i for i in (text.find(s) for s in stop) if i >= 0]
        upto = min(hits) if hits else max(sent, len(text) - hold)
        stopped = bool(hits)
        out.append(text[sent:upto])
        sent = upto
    out.append("" if stopped else text[sent:])
    return out
