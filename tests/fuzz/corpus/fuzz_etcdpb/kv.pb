
/mlfs/j/attempt	 *{"to":3}0M