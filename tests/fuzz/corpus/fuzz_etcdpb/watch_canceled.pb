
	{È	  (2*mvcc: required revision has been compacted