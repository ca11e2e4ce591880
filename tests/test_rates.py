from dbq.client.rates import RateMeter


def test_rates_cover_the_window_and_ignore_clock_steps_back():
    m = RateMeter(window=10)
    assert m.rates() is None
    m.add(0, 0, 0)
    assert m.rates() is None
    for t in range(1, 31):
        m.add(t, 100 * t, 50 * t)  # 100 pushes/s, 50 takes/s
    assert m.rates() == (100.0, 50.0)
    assert m.samples[0][0] == 20 and len(m.samples) == 11  # older samples dropped
    m.add(25, 0, 0)  # a clock stepping back is ignored
    assert m.rates() == (100.0, 50.0)
    m.add(40, 3000, 1500)  # no pushes for 10 s: the window's rate says so
    assert m.rates() == (0.0, 0.0)
