
ab