from engine.detokenizer import Detokenizer, StopStrings


def test_incremental_text_equals_full_decode(smollm_tokenizer):
    tok = smollm_tokenizer
    text = "Héllo wörld! 你好, emoji 🎉🎉 and\nnew lines  with  spaces."
    prompt = tok.encode("Say:", add_special_tokens=False)
    ids = tok.encode(text, add_special_tokens=False)
    detok = Detokenizer(tok, prompt)
    deltas = [detok.add(i) for i in ids]
    assert "".join(deltas) == tok.decode(ids)
    assert all("\ufffd" not in d for d in deltas)


def test_stop_strings_hold_back_and_cut():
    stops = StopStrings(["END", "\n\n"])
    out = []
    for delta in ["Hello E", "N", "ough said. E", "ND more"]:
        text, stopped = stops.feed(delta)
        out.append(text)
        if stopped:
            break
    assert "".join(out) == "Hello ENough said. " and stopped


def test_held_text_is_released_when_no_stop_follows():
    stops = StopStrings(["STOP"])
    text, stopped = stops.feed("abc ST")
    assert (text, stopped) == ("abc ", False)
    assert stops.flush() == "ST"


def test_the_matched_stop_is_the_earliest_then_the_first_listed():
    stops = StopStrings(["later", "ab", "abc"])
    assert stops.matched is None
    assert stops.feed("x abc later") == ("x ", True) and stops.matched == "ab"  # same start: first listed
    stops = StopStrings(["later", "abc"])
    assert stops.feed("x ab") == ("x ", False) and stops.matched is None
    assert stops.feed("c later") == ("", True) and stops.matched == "abc"  # earliest in the text
